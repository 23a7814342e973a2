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

// The forward and the backward of each layer apart (medians over `reps`
// runs, as MeasureLayerSeconds), the model's first layer's backward as a
// pipeline's first stage runs it: without the input gradient nobody reads.
// `weight`: the weight half of the backward split in two (Layer::
// BackwardWeight, as zero-bubble schedules run it), timed in runs of their
// own; 0 for layers that defer nothing.
struct LayerPasses {
  std::vector<double> forward;
  std::vector<double> backward;
  std::vector<double> weight;
  // Page faults during the timed runs: 0 once warm-up runs have left the
  // heap as a training step in steady state finds it (a process that
  // keeps freed memory: core/memory.h).
  int64_t timed_page_faults = 0;
};
absl::StatusOr<LayerPasses> MeasureLayerPasses(const gpipe::v1::JobSpec& spec,
                                               int64_t micro_batch_size,
                                               int reps);

// What each layer costs once a step, whatever the micro-batches: `norm`,
// the pass summing its gradients' squares (the gradient-norm exchange);
// `update`, the spec's optimizer over its parameters, zeroing their
// gradients, and for the layers that keep their weights packed for the
// products (LayerCost::packed_weight_bytes) the first forward and backward
// after an update over the others (re-packing them). Medians over `reps`
// steps on micro-batches of `micro_batch_size`; layers without parameters
// cost 0. Uses the calling thread's compute-thread setting. Errors as
// MeasureLayerSeconds's, and the optimizer's.
struct LayerStepSeconds {
  std::vector<double> norm;
  std::vector<double> update;
};
absl::StatusOr<LayerStepSeconds> MeasureLayerStepSeconds(
    const gpipe::v1::JobSpec& spec, int64_t micro_batch_size, int reps);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_LAYER_PROFILE_H_
