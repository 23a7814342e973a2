// Where a reference-trainer step spends its time: the same work as
// ReferenceTrainer::Step (gather, forward and backward per micro-batch,
// loss, clipping, optimizer), timed piece by piece and layer by layer.
#ifndef GPIPE_BENCH_STEP_PROFILE_H_
#define GPIPE_BENCH_STEP_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "services/pipeline/reference_trainer.h"

namespace gpipe::bench {

// The part that times the gradient norm, clipping, the optimizer's update
// and zeroing the gradients.
inline constexpr char kUpdatePart[] = "clip + optimizer + zero grad";

struct StepProfile {
  struct Part {
    std::string name;          // "gather", "layers.3 conv2d", "optimizer", ...
    double forward_ms = 0.0;   // per step, mean over the profiled steps
    double backward_ms = 0.0;  // 0 for parts without a backward
    int64_t layer = -1;        // the model's global layer index, or -1
  };
  std::vector<Part> parts;  // in execution order
  double total_ms = 0.0;    // sum of every part, per step
};

// Runs `steps` instrumented steps on `trainer`'s model, optimizer and data
// (batch indices drawn like the sampler's: distinct rows per step), with
// `trainer.micro_batches()` micro-batches. It changes the parameters, so run
// it after the timed steps.
StepProfile ProfileSteps(ReferenceTrainer& trainer, int steps);

// The profile as a table on stdout: each part's forward and backward ms and
// its share of the total.
void PrintProfile(const StepProfile& p);

}  // namespace gpipe::bench

#endif  // GPIPE_BENCH_STEP_PROFILE_H_
