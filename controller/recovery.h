// Checkpoint bookkeeping for the controller's state machine: which stage
// reports make a checkpoint, committing it (the manifest), keeping the last
// N, and choosing the checkpoint a restarted job restores (the newest whose
// files still match their manifest; corrupt ones are dropped and counted).
#ifndef GPIPE_CONTROLLER_RECOVERY_H_
#define GPIPE_CONTROLLER_RECOVERY_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpipe/v1/controller.pb.h"
#include "services/pipeline/step_plan.h"

namespace gpipe::controller {

// Where the controller keeps a stage's file of a checkpoint, and of the
// final parameters (services/storage/checkpoint_layout.h): what a stage
// writes on a shared path, and where an uploaded file goes.
std::string CheckpointFilePath(const std::string& checkpoint_dir,
                               const std::string& job_id, int64_t step,
                               int64_t epoch, int64_t stage);
std::string FinalFilePath(const std::string& checkpoint_dir,
                          const std::string& job_id, int64_t epoch,
                          int64_t stage);

// InvalidArgument unless `report` is of a checkpoint step of `plan` and
// names the file its stage must write for its step and epoch
// (services/storage/checkpoint_layout.h), with a digest and a size (so a
// stage cannot point the controller at any other file).
absl::Status CheckCheckpointReport(const std::string& checkpoint_dir,
                                   const gpipe::v1::StageCheckpointed& report,
                                   const StepPlan& plan);

// InvalidArgument unless a StageFinished report names the file its stage
// must write (the final parameters' file of its epoch and stage).
absl::Status CheckFinishedReport(const std::string& checkpoint_dir,
                                 const gpipe::v1::StageFinished& report);

// Writes the manifest of `reports` (one per stage, all of one step) in that
// step's directory, atomically, and returns its reference. The manifest
// records `spec`, the job's as it runs, so a fetched checkpoint says what
// its ids and columns mean (CheckpointManifest.spec).
absl::StatusOr<gpipe::v1::CheckpointRef> CommitCheckpoint(
    const std::string& checkpoint_dir, const std::string& job_id, int64_t epoch,
    const std::vector<gpipe::v1::StageCheckpointed>& reports,
    const gpipe::v1::JobSpec& spec = {});

// Commits the final parameters: hashes each stage's final file (`stages`:
// path, stage and layer range) and writes their manifest in the job's
// final directory. They are no checkpoint (no optimizer state, no step to
// continue from), so the ref is not for the job's list. Reads every file:
// call it off the controller's lock.
absl::StatusOr<gpipe::v1::CheckpointRef> CommitFinalParameters(
    const std::string& checkpoint_dir, const std::string& job_id, int64_t epoch,
    int64_t step, std::vector<gpipe::v1::StageCheckpointed> stages,
    const gpipe::v1::JobSpec& spec = {});

// Drops from `status`'s checkpoints any ref to the job's final parameters
// (which a controller before this one listed); true when one was dropped.
bool RemoveFinalParametersRefs(const std::string& checkpoint_dir,
                               const std::string& job_id,
                               gpipe::v1::JobStatus* status);

// Checks every file a stage reported for a checkpoint against the size and
// sha256 it reported (DataLoss naming the file otherwise), so a checkpoint
// is verified once, when it is committed. Reads every file: off the lock.
absl::Status VerifyCheckpointReports(
    const std::vector<gpipe::v1::StageCheckpointed>& reports);

// Appends `ref` to the status's committed checkpoints and keeps the newest
// `keep` (default 3 when 0). Returns the directories of those it dropped,
// for RemoveCheckpointDirs off the lock.
std::vector<std::string> KeepCheckpoints(gpipe::v1::JobStatus* status,
                                         gpipe::v1::CheckpointRef ref,
                                         int64_t keep);
void RemoveCheckpointDirs(const std::vector<std::string>& dirs);

// The folders of job `id`'s files: its folder under `checkpoint_dir`, and
// the folder named after the job above its model and each checkpoint
// `status` lists, wherever they were written (under an earlier
// --checkpoint_dir: delete removed an empty folder there and left the
// files). Sorted, each once.
std::vector<std::string> JobFileDirs(const std::string& checkpoint_dir,
                                     const std::string& id,
                                     const gpipe::v1::JobStatus& status);

// Folders directly under `checkpoint_dir` named as job folders are
// ("job-" and the id) that no job in `known` owns, sorted: the files of
// jobs a controller without --store forgot at its restart (or of another
// store's), which nothing would ever delete.
std::vector<std::string> UnknownJobDirs(const std::string& checkpoint_dir,
                                        const std::set<std::string>& known);

// When the checkpoint store is full: drops the oldest of `status`'s
// committed checkpoints where more than one is left (the newest stays the
// restore point), and returns its step and directory for
// RemoveCheckpointDirs. A store with room for exactly `keep` checkpoints
// failed every new one: the oldest went only after the new one committed.
struct DroppedCheckpoint {
  int64_t step = 0;
  std::string dir;
};
std::optional<DroppedCheckpoint> DropOldestCheckpoint(
    gpipe::v1::JobStatus* status);

// Removes the stage files of epochs before `epoch` (and the temporary files
// of their writes) from the job's uncommitted step directories and final
// directory, and with `remove_empty_dirs` (the job has ended) those
// directories once empty. Nothing of `epoch` or later is touched, nor any
// directory with a manifest or whose manifest cannot be looked for. A
// restart left a failed checkpoint's files behind for good (on a full
// store, the space the next try needed). Returns how many files it
// removed. File I/O: off the lock.
int64_t RemoveStaleStageFiles(const std::string& checkpoint_dir,
                              const std::string& job_id, int64_t epoch,
                              bool remove_empty_dirs);

// Which committed checkpoint a restarting job restores: the newest whose
// manifest and files are intact. Each newer one that is not is DataLoss,
// listed in `unusable` (newest first). nullopt: start from the beginning.
struct RestorePoint {
  std::optional<gpipe::v1::CheckpointRef> chosen;
  std::vector<std::pair<gpipe::v1::CheckpointRef, absl::Status>> unusable;
};
// Reads and hashes every file of the checkpoints it tries: call it off the
// controller's lock, on a copy of the list.
RestorePoint CheckRestorePoint(
    const std::vector<gpipe::v1::CheckpointRef>& committed);
// Removes the unusable checkpoints of `point` from the status (those still
// listed); returns how many.
int64_t DropUnusable(const std::string& job_id, gpipe::v1::JobStatus* status,
                     const RestorePoint& point);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_RECOVERY_H_
