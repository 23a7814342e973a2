#include "services/pipeline/stage_checkpoint.h"

#include <filesystem>
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

StageFileContent ContentOf(const std::vector<NamedTensor>& state) {
  StageFileContent content;
  // Reserved up front: the pointers below refer into it.
  content.host_copies.reserve(state.size());
  for (const NamedTensor& t : state) {
    if (t.tensor->device() == Device::kCpu) {
      content.tensors.emplace_back(t.name, t.tensor);
    } else {
      content.host_copies.push_back(t.tensor->To(Device::kCpu));
      content.tensors.emplace_back(t.name, &content.host_copies.back());
    }
  }
  return content;
}

}  // namespace

StageFileContent CheckpointContent(Stage& stage, int64_t step) {
  StageFileContent content = ContentOf(CheckpointTensors(stage));
  const StagePlacement& p = stage.placement();
  content.metadata = {{"format", "pt"},
                      {"step", absl::StrCat(step)},
                      {"layer_begin", absl::StrCat(p.layer_begin)},
                      {"layer_end", absl::StrCat(p.layer_end)}};
  return content;
}

StageFileContent FinalParametersContent(Stage& stage) {
  StageFileContent content = ContentOf(stage.model().StateTensors());
  content.metadata = {{"format", "pt"}};
  return content;
}

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
  const StageFileContent content = CheckpointContent(stage, step);
  RETURN_IF_ERROR(WriteSafetensors(path, content.tensors, content.metadata));
  WrittenCheckpoint written;
  ASSIGN_OR_RETURN(written.sha256, storage::Sha256File(path));
  written.bytes = static_cast<int64_t>(std::filesystem::file_size(path, error));
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot stat ", path, ": ", error.message()));
  }
  return written;
}

bool StageNeedsFile(const StagePlacement& p,
                    const gpipe::v1::CheckpointFile& file) {
  return file.layer_end() > p.layer_begin && file.layer_begin() < p.layer_end;
}

absl::Status LoadStageState(Stage& stage,
                            const std::map<std::string, Tensor>& found,
                            absl::string_view what) {
  const std::vector<NamedTensor> wanted = CheckpointTensors(stage);
  std::vector<const Tensor*> sources;
  sources.reserve(wanted.size());
  for (const NamedTensor& t : wanted) {
    auto it = found.find(t.name);
    if (it == found.end()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint ", what, " has no tensor ", t.name));
    }
    const Tensor& from = it->second;
    if (from.dtype() != t.tensor->dtype() ||
        !(from.shape() == t.tensor->shape())) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", what, ": tensor ", t.name, " is ",
          from.shape().ToString(), ", another shape or dtype than the model's ",
          t.tensor->shape().ToString(), " (a checkpoint of another model?)"));
    }
    sources.push_back(&from);
  }
  // CopyFrom, not memcpy: the stage's tensors may live on a device.
  for (size_t i = 0; i < wanted.size(); ++i) {
    wanted[i].tensor->CopyFrom(*sources[i]);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RestoreStageCheckpoint(
    Stage& stage, const std::string& manifest_path) {
  ASSIGN_OR_RETURN(gpipe::v1::CheckpointManifest manifest,
                   storage::ReadManifest(manifest_path));
  std::map<std::string, Tensor> found;
  for (const gpipe::v1::CheckpointFile& file : manifest.files()) {
    if (!StageNeedsFile(stage.placement(), file)) continue;
    RETURN_IF_ERROR(storage::VerifyCheckpointFile(manifest_path, file));
    const std::string path = storage::ManifestFilePath(manifest_path, file);
    ASSIGN_OR_RETURN(SafetensorsFile read, ReadSafetensors(path));
    RETURN_IF_ERROR(
        storage::CheckFileStep(path, read.metadata, manifest.step()));
    for (auto& [name, tensor] : read.tensors) {
      found.insert_or_assign(name, std::move(tensor));
    }
  }
  RETURN_IF_ERROR(LoadStageState(stage, found, manifest_path));
  return manifest.step();
}

}  // namespace gpipe
