#include "controller/merge.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/storage/safetensors.h"

namespace gpipe::controller {

absl::Status MergeStageParameters(
    const std::vector<std::string>& stage_paths, const std::string& out_path,
    const std::map<std::string, std::string>& metadata) {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, size_t> owner;  // tensor name -> stage
  for (size_t stage = 0; stage < stage_paths.size(); ++stage) {
    ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(stage_paths[stage]));
    for (auto& [name, tensor] : file.tensors) {
      auto [it, added] = owner.emplace(name, stage);
      if (!added) {
        return absl::DataLossError(
            absl::StrCat(stage_paths[stage], ": tensor ", name, " of stage ",
                         stage, " is also in stage ", it->second, " (",
                         stage_paths[it->second], ")"));
      }
      tensors.emplace(name, std::move(tensor));
    }
  }
  std::error_code error;
  const std::filesystem::path parent =
      std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", parent.string(), ": ", error.message()));
  }
  std::vector<std::pair<std::string, const Tensor*>> list;
  list.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) list.emplace_back(name, &tensor);
  return WriteSafetensors(out_path, list, metadata);
}

}  // namespace gpipe::controller
