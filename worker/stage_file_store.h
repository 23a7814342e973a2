// Where a stage's files go and come from: its periodic checkpoints, its
// final parameters, and the checkpoint a restarted stage restores. The
// assignment says which store (checkpoint_transport): files on a path the
// controller shares (shared_path_store.h) or uploads to and downloads from
// the controller (controller_file_store.h). The executor does not care:
// either way the controller ends up with the same safetensors bytes, and
// the report it gets names the file on the controller's side.
#ifndef GPIPE_WORKER_STAGE_FILE_STORE_H_
#define GPIPE_WORKER_STAGE_FILE_STORE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gpipe/v1/controller.pb.h"
#include "services/pipeline/stage.h"

namespace gpipe {

class StageFileStore {
 public:
  virtual ~StageFileStore() = default;

  struct Stored {
    std::string path;  // as the controller sees it
    std::string sha256;
    int64_t bytes = 0;
  };

  // The stage's checkpoint after `step` steps (stage_checkpoint.h).
  virtual absl::StatusOr<Stored> SaveCheckpoint(const gpipe::v1::Assignment& a,
                                                Stage& stage, int64_t step) = 0;
  // The stage's final parameters.
  virtual absl::StatusOr<Stored> SaveFinal(const gpipe::v1::Assignment& a,
                                           Stage& stage) = 0;
  // Loads the checkpoint the assignment restores into `stage` and returns
  // its step. Corrupt or missing files are DataLoss naming them.
  virtual absl::StatusOr<int64_t> Restore(const gpipe::v1::Assignment& a,
                                          Stage& stage) = 0;
};

// The report a stage of `a` sends once its checkpoint of `step` is stored.
gpipe::v1::WorkerMessage CheckpointedReport(const gpipe::v1::Assignment& a,
                                            int64_t step,
                                            const StageFileStore::Stored& s);

}  // namespace gpipe

#endif  // GPIPE_WORKER_STAGE_FILE_STORE_H_
