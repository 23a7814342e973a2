// Checkpoint bookkeeping for the controller's state machine: which stage
// reports make a checkpoint, committing it (the manifest), keeping the last
// N, and choosing the checkpoint a restarted job restores (the newest whose
// files still match their manifest; corrupt ones are dropped and counted).
#ifndef GPIPE_CONTROLLER_RECOVERY_H_
#define GPIPE_CONTROLLER_RECOVERY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpipe/v1/controller.pb.h"

namespace gpipe::controller {

// Where stage `stage` of epoch `epoch` writes its checkpoint for `step`:
// <checkpoint_dir>/<job>/step-<step>/e<epoch>-stage-<stage>.safetensors.
std::string CheckpointStepDir(const std::string& checkpoint_dir,
                              const std::string& job_id, int64_t step);

// InvalidArgument unless `report` names the file its stage must write for
// its step and epoch, with a digest and a size (so a stage cannot point the
// controller at any other file).
absl::Status CheckCheckpointReport(const std::string& checkpoint_dir,
                                   const gpipe::v1::StageCheckpointed& report,
                                   int64_t every, int64_t total_steps);

// InvalidArgument unless a StageFinished report names the file its stage
// must write: <checkpoint_dir>/<job>/final/e<epoch>-stage-<stage>.safetensors.
absl::Status CheckFinishedReport(const std::string& checkpoint_dir,
                                 const gpipe::v1::StageFinished& report);

// Writes the manifest of `reports` (one per stage, all of one step) in that
// step's directory, atomically, and returns its reference.
absl::StatusOr<gpipe::v1::CheckpointRef> CommitCheckpoint(
    const std::string& checkpoint_dir, const std::string& job_id, int64_t epoch,
    const std::vector<gpipe::v1::StageCheckpointed>& reports);

// Appends `ref` to the status's committed checkpoints and keeps the newest
// `keep` (default 3 when 0), removing the directories of the rest.
void KeepCheckpoints(gpipe::v1::JobStatus* status, gpipe::v1::CheckpointRef ref,
                     int64_t keep);

// The newest committed checkpoint of `status` whose manifest and files are
// intact. Each one that is not is DataLoss: logged, removed from the
// status and counted in *corrupt. nullopt: start from the beginning.
std::optional<gpipe::v1::CheckpointRef> ChooseRestorePoint(
    const std::string& job_id, gpipe::v1::JobStatus* status, int64_t* corrupt);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_RECOVERY_H_
