#include "worker/shared_path_store.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/pipeline/stage_checkpoint.h"
#include "services/storage/checkpoint_layout.h"
#include "services/storage/safetensors.h"

namespace gpipe {

absl::StatusOr<StageFileStore::Stored> SharedPathStore::SaveCheckpoint(
    const gpipe::v1::Assignment& a, Stage& stage, int64_t step) {
  if (a.checkpoint_dir().empty()) {
    return absl::FailedPreconditionError(
        "the assignment names no checkpoint directory");
  }
  Stored stored;
  stored.path = storage::StageFilePath(
      storage::CheckpointStepDir(a.checkpoint_dir(), step), a.epoch(),
      a.stage());
  ASSIGN_OR_RETURN(WrittenCheckpoint written,
                   SaveStageCheckpoint(stage, step, stored.path));
  stored.sha256 = written.sha256;
  stored.bytes = written.bytes;
  return stored;
}

absl::StatusOr<StageFileStore::Stored> SharedPathStore::SaveFinal(
    const gpipe::v1::Assignment& a, Stage& stage) {
  if (a.output_dir().empty()) {
    return absl::FailedPreconditionError(
        "the assignment names no output directory");
  }
  std::error_code error;
  std::filesystem::create_directories(a.output_dir(), error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", a.output_dir(), ": ", error.message()));
  }
  Stored stored;
  stored.path = storage::StageFilePath(a.output_dir(), a.epoch(), a.stage());
  const StageFileContent content = FinalParametersContent(stage);
  // The controller hashes the final files when it commits them.
  RETURN_IF_ERROR(
      WriteSafetensors(stored.path, content.tensors, content.metadata));
  return stored;
}

absl::StatusOr<int64_t> SharedPathStore::Restore(const gpipe::v1::Assignment& a,
                                                 Stage& stage) {
  return RestoreStageCheckpoint(stage, a.restore_manifest());
}

}  // namespace gpipe
