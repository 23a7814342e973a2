// A stage's share of a checkpoint: its parameters, buffers and optimizer
// state (momentum, Adam moments) in one safetensors file, every tensor named
// by global layer index ("layers.3.weight", "layers.3.weight.exp_avg"), so a
// stage of any partition restores from the files of any other. The files
// travel either as files on a shared path (SaveStageCheckpoint,
// RestoreStageCheckpoint) or as byte streams through the controller (the
// worker encodes StageFileContent and loads what it decodes with
// LoadStageState); the bytes are the same.
#ifndef GPIPE_SERVICES_PIPELINE_STAGE_CHECKPOINT_H_
#define GPIPE_SERVICES_PIPELINE_STAGE_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "gpipe/v1/checkpoint.pb.h"
#include "services/pipeline/stage.h"

namespace gpipe {

// The tensors of one stage file, on the host, and its metadata: what
// SafetensorsEncoder or WriteSafetensors takes. Tensors that live on a
// device are copied into `host_copies`, which the pointers then refer to.
struct StageFileContent {
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  std::map<std::string, std::string> metadata;
  std::vector<Tensor> host_copies;
};

// The stage's checkpoint after `step` steps: model state and optimizer
// state. The optimizer's step counter is `step` itself: the next update is
// step + 1.
StageFileContent CheckpointContent(Stage& stage, int64_t step);
// The stage's final parameters (model state only).
StageFileContent FinalParametersContent(Stage& stage);

struct WrittenCheckpoint {
  std::string sha256;  // of the file as written
  int64_t bytes = 0;
};

// Writes CheckpointContent(stage, step) to `path` (atomically; its
// directory is created).
absl::StatusOr<WrittenCheckpoint> SaveStageCheckpoint(Stage& stage,
                                                      int64_t step,
                                                      const std::string& path);

// Whether the stage holds any of the layers of a checkpoint's `file`.
bool StageNeedsFile(const StagePlacement& placement,
                    const gpipe::v1::CheckpointFile& file);

// Copies every tensor the stage holds (model and optimizer state) from
// `found`, by global name, onto the stage's device. Every tensor is checked
// before any is copied: a missing one, or another shape or dtype, is
// DataLoss naming it and `what`, and leaves the stage as it was.
absl::Status LoadStageState(Stage& stage,
                            const std::map<std::string, Tensor>& found,
                            absl::string_view what);

// Restores `stage` from the committed checkpoint at `manifest_path`: reads
// the files it needs (each checked against its sha256 first) and loads
// them. A corrupt file is DataLoss naming it. Returns the checkpoint's step.
absl::StatusOr<int64_t> RestoreStageCheckpoint(
    Stage& stage, const std::string& manifest_path);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_STAGE_CHECKPOINT_H_
