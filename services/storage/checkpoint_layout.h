// Where a job's checkpoints and final parameters live: the one agreement
// between the stages that write them and the controller that commits,
// checks and restores them.
//
//   <root>/<job>/step-<N>/e<epoch>-stage-<i>.safetensors   one per stage
//   <root>/<job>/step-<N>/MANIFEST.json                    the commit
//   <root>/<job>/final/e<epoch>-stage-<i>.safetensors      final parameters
//   <root>/<job>/final/MANIFEST.json                       their commit
//   <root>/<job>/model.safetensors                         merged model
//
// Stage files are named by epoch: a stale worker of an older epoch that
// wakes up writes beside the current files, never over them.
#ifndef GPIPE_SERVICES_STORAGE_CHECKPOINT_LAYOUT_H_
#define GPIPE_SERVICES_STORAGE_CHECKPOINT_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace gpipe::storage {

// <root>/<job>: everything of one job.
std::string JobCheckpointDir(absl::string_view root, absl::string_view job_id);
// <job_dir>/step-<step>.
std::string CheckpointStepDir(absl::string_view job_dir, int64_t step);
// <job_dir>/final.
std::string FinalParametersDir(absl::string_view job_dir);

// <job_dir>/model.safetensors: the stages' final parameters in one file.
std::string MergedModelPath(absl::string_view job_dir);
// The sha256 of the model file as the controller wrote it (hex, one line):
// a fetch checks the file against it, so a file damaged on the
// controller's disk is refused, not delivered.
std::string ModelDigestPath(absl::string_view model_path);

// "e<epoch>-stage-<stage>.safetensors".
std::string StageFileName(int64_t epoch, int64_t stage);
// <dir>/StageFileName(epoch, stage).
std::string StageFilePath(absl::string_view dir, int64_t epoch, int64_t stage);

struct StageFileId {
  int64_t epoch = 0;
  int64_t stage = 0;
  bool operator==(const StageFileId&) const = default;
};
// The inverse of StageFileName: nullopt for any other name (leading zeros,
// signs, other suffixes or trailing bytes included).
std::optional<StageFileId> ParseStageFileName(absl::string_view name);
// The step of a "step-<N>" directory name (N > 0); nullopt otherwise.
std::optional<int64_t> ParseCheckpointStepDirName(absl::string_view name);

}  // namespace gpipe::storage

#endif  // GPIPE_SERVICES_STORAGE_CHECKPOINT_LAYOUT_H_
