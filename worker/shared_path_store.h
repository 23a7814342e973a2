// Stage files on a path the controller shares with every worker
// (CHECKPOINT_TRANSPORT_SHARED_PATH): a ReadWriteMany volume, or one
// machine. The stage writes under the assignment's checkpoint_dir and
// output_dir and restores from its restore_manifest.
#ifndef GPIPE_WORKER_SHARED_PATH_STORE_H_
#define GPIPE_WORKER_SHARED_PATH_STORE_H_

#include "worker/stage_file_store.h"

namespace gpipe {

class SharedPathStore final : public StageFileStore {
 public:
  absl::StatusOr<Stored> SaveCheckpoint(const gpipe::v1::Assignment& a,
                                        Stage& stage, int64_t step) override;
  absl::StatusOr<Stored> SaveFinal(const gpipe::v1::Assignment& a,
                                   Stage& stage) override;
  absl::StatusOr<int64_t> Restore(const gpipe::v1::Assignment& a,
                                  Stage& stage) override;
};

}  // namespace gpipe

#endif  // GPIPE_WORKER_SHARED_PATH_STORE_H_
