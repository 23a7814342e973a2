// A stage's share of a checkpoint: its parameters, buffers and optimizer
// state (momentum, Adam moments) in one safetensors file, every tensor named
// by global layer index ("layers.3.weight", "layers.3.weight.exp_avg"), so a
// stage of any partition restores from the files of any other.
#ifndef GPIPE_SERVICES_PIPELINE_STAGE_CHECKPOINT_H_
#define GPIPE_SERVICES_PIPELINE_STAGE_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/pipeline/stage.h"

namespace gpipe {

struct WrittenCheckpoint {
  std::string sha256;  // of the file as written
  int64_t bytes = 0;
};

// Writes the state of `stage` after `step` steps to `path` (atomically; its
// directory is created). The optimizer's step counter is `step` itself: the
// next update is step + 1.
absl::StatusOr<WrittenCheckpoint> SaveStageCheckpoint(Stage& stage,
                                                      int64_t step,
                                                      const std::string& path);

// Restores `stage` from the committed checkpoint at `manifest_path`: reads
// the files whose layers overlap the stage's (each checked against its
// sha256 first) and copies every tensor the stage holds. A missing tensor,
// a shape mismatch or a corrupt file is DataLoss naming it. Returns the
// checkpoint's step.
absl::StatusOr<int64_t> RestoreStageCheckpoint(
    Stage& stage, const std::string& manifest_path);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_STAGE_CHECKPOINT_H_
