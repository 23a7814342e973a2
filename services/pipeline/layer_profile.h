// Measured layer costs: what each layer of a model really takes on this
// machine, for balancing by time instead of by the FLOP estimate (which
// misjudges memory-bound layers such as normalization and pooling).
#ifndef GPIPE_SERVICES_PIPELINE_LAYER_PROFILE_H_
#define GPIPE_SERVICES_PIPELINE_LAYER_PROFILE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"

namespace gpipe {

// Builds the spec's model (seeded with spec.seed()), feeds it a random
// micro-batch of `micro_batch_size` samples (token ids in [0, vocab) for an
// integer input) and returns, per layer, the median over `reps` runs (after
// one warm-up run) of its forward plus backward seconds. Uses the calling
// thread's compute-thread setting. Errors: an invalid model, micro_batch_size
// or reps < 1.
absl::StatusOr<std::vector<double>> MeasureLayerSeconds(
    const gpipe::v1::JobSpec& spec, int64_t micro_batch_size, int reps);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_LAYER_PROFILE_H_
