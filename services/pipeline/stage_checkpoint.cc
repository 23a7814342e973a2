#include "services/pipeline/stage_checkpoint.h"

#include <cstring>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors.h"
#include "services/storage/sha256.h"

namespace gpipe {
namespace {

// Everything a stage's checkpoint holds, by global name.
std::vector<NamedTensor> CheckpointTensors(Stage& stage) {
  std::vector<NamedTensor> all = stage.model().StateTensors();
  for (const NamedTensor& t : stage.optimizer().State()) all.push_back(t);
  return all;
}

}  // namespace

absl::StatusOr<WrittenCheckpoint> SaveStageCheckpoint(Stage& stage,
                                                      int64_t step,
                                                      const std::string& path) {
  const std::filesystem::path parent =
      std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", parent.string(), ": ", error.message()));
  }
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const NamedTensor& t : CheckpointTensors(stage)) {
    tensors.emplace_back(t.name, t.tensor);
  }
  const StagePlacement& p = stage.placement();
  RETURN_IF_ERROR(
      WriteSafetensors(path, tensors,
                       {{"format", "pt"},
                        {"step", absl::StrCat(step)},
                        {"layer_begin", absl::StrCat(p.layer_begin)},
                        {"layer_end", absl::StrCat(p.layer_end)}}));
  WrittenCheckpoint written;
  ASSIGN_OR_RETURN(written.sha256, storage::Sha256File(path));
  written.bytes = static_cast<int64_t>(std::filesystem::file_size(path, error));
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot stat ", path, ": ", error.message()));
  }
  return written;
}

absl::StatusOr<int64_t> RestoreStageCheckpoint(
    Stage& stage, const std::string& manifest_path) {
  ASSIGN_OR_RETURN(gpipe::v1::CheckpointManifest manifest,
                   storage::ReadManifest(manifest_path));
  const StagePlacement& p = stage.placement();
  std::map<std::string, Tensor> found;
  for (const gpipe::v1::CheckpointFile& file : manifest.files()) {
    if (file.layer_end() <= p.layer_begin || file.layer_begin() >= p.layer_end)
      continue;
    RETURN_IF_ERROR(storage::VerifyCheckpointFile(manifest_path, file));
    const std::string path = storage::ManifestFilePath(manifest_path, file);
    ASSIGN_OR_RETURN(SafetensorsFile read, ReadSafetensors(path));
    for (auto& [name, tensor] : read.tensors) {
      found.insert_or_assign(name, std::move(tensor));
    }
  }
  // Every tensor is checked before any is copied: a checkpoint of another
  // model must leave the stage as it was, not half overwritten.
  const std::vector<NamedTensor> wanted = CheckpointTensors(stage);
  std::vector<const Tensor*> sources;
  sources.reserve(wanted.size());
  for (const NamedTensor& t : wanted) {
    auto it = found.find(t.name);
    if (it == found.end()) {
      return absl::DataLossError(absl::StrCat("checkpoint ", manifest_path,
                                              " has no tensor ", t.name));
    }
    const Tensor& from = it->second;
    if (from.dtype() != t.tensor->dtype() ||
        !(from.shape() == t.tensor->shape())) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", manifest_path, ": tensor ", t.name, " is ",
          from.shape().ToString(), ", another shape or dtype than the model's ",
          t.tensor->shape().ToString(), " (a checkpoint of another model?)"));
    }
    sources.push_back(&from);
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    std::memcpy(wanted[i].tensor->raw(), sources[i]->raw(),
                sources[i]->nbytes());
  }
  return manifest.step();
}

}  // namespace gpipe
