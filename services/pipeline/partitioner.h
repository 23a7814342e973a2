// The partitioner: which contiguous run of layers each of the K stages gets.
// A pipeline runs at the pace of its slowest stage, so the layers are split
// to minimize the most expensive stage, exactly (not greedily); among the
// splits that reach that minimum it takes the one whose stage costs vary
// least, which leaves the most slack on every other stage.
#ifndef GPIPE_SERVICES_PIPELINE_PARTITIONER_H_
#define GPIPE_SERVICES_PIPELINE_PARTITIONER_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"

namespace gpipe {

// Layers per stage minimizing the most expensive stage (exact), ties broken
// by lower variance of stage costs. Every stage gets at least one layer.
// Stage k's cost is stage_weights[k] times the sum of its layers' costs
// (empty: all 1; with weights the tie-break is the smallest sum of squared
// stage costs). With `first_layer_input_half` the costs are forwards and
// the weights count a step in forwards (RematStageWeights), and the first
// stage does one forward of the model's first layer less: that layer
// computes no input gradient (InputGradUsed). With `zero_bubble_v` the
// stages are ZB-V's 2K chunks, chunks g and 2K-1-g on one worker: the cut
// is then moved from there a layer at a time while that lowers the
// busiest worker's sum (then the busiest chunk). Errors (InvalidArgument):
// stages < 1, stages > costs.size(), a negative or non-finite cost,
// weights that are not `stages` numbers of at least 1 with the flag,
// positive without.
absl::StatusOr<std::vector<int64_t>> PartitionByCost(
    const std::vector<double>& layer_costs, int64_t stages,
    const std::vector<double>& stage_weights = {},
    bool first_layer_input_half = false, bool zero_bubble_v = false);

// The same exact min-max cut for any stage cost: cost(stage, begin, end) is
// what stage `stage` (0-based) takes for layers [begin, end), and must not
// decrease as the range grows. What the balancer cuts by when stages differ
// in more than a weight (measured forward and backward, re-materialization,
// worker speed). Errors: stages < 1 or > layers.
absl::StatusOr<std::vector<int64_t>> PartitionByStageCost(
    int64_t layers, int64_t stages,
    const std::function<double(int64_t stage, int64_t begin, int64_t end)>&
        cost);

// What a stage's step costs per unit of its layers' forward cost: 3 (the
// forward, and a backward of about twice it), 4 where it re-materializes
// (the forward runs again inside the backward). Under except_last the last
// stage does less than the others for the same layers, so it should get
// more of them.
std::vector<double> RematStageWeights(RematMode mode, int64_t stages);

// PartitionByCost for a run of `schedule`: under ZB-V (`stages` its 2K
// chunks) both the chunks' min-max cut and the cut that balances its
// workers (zero_bubble_v), whichever the cost model's simulation of a step
// of `spec`'s batch in `micro_batches` finds faster (CostModelStepSeconds;
// the chunks' cut on a tie); the chunks' cut under any other schedule.
absl::StatusOr<std::vector<int64_t>> PartitionForSchedule(
    const gpipe::v1::JobSpec& spec, const ModelShapes& shapes,
    const std::vector<double>& layer_costs, int64_t stages,
    ScheduleKind schedule, int64_t micro_batches, RematMode remat,
    const std::vector<double>& stage_weights, bool first_layer_input_half);

// The spec's explicit pipeline.balance when set (must have `stages` entries
// > 0 summing to the layer count: the error names pipeline.balance), else
// PartitionForSchedule over CostModelLayerCosts of the spec's model,
// weighted by the spec's remat mode (RematStageWeights), for its schedule
// and micro-batches.
absl::StatusOr<std::vector<int64_t>> PartitionJob(
    const gpipe::v1::JobSpec& spec, int64_t stages);

// The cut of a `stages`-stage run of `spec`, which may have another stage
// count than the spec's own (an elastic shrink, --stages, serving): the
// spec's explicit balance when it is for `stages` (K, or K x v chunks of an
// interleaved spec), else PartitionJob as if the spec had none (a balance
// describes its own stage count only).
absl::StatusOr<std::vector<int64_t>> PartitionJobAt(
    const gpipe::v1::JobSpec& spec, int64_t stages);

// Cost of each layer from the cost model: forward FLOPs per sample plus a
// small floor (0.1% of the mean layer), so that free layers such as Flatten
// still count a little and a split never piles them up for nothing. Training
// cost is proportional (backward ~2x forward), so balancing the forward
// balances the step.
std::vector<double> CostModelLayerCosts(const ModelShapes& shapes);

// First layer index of each stage: {0, b0, b0+b1, ...} (size K).
std::vector<int64_t> StageBegins(const std::vector<int64_t>& balance);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_PARTITIONER_H_
