// The memory model: what one stage of a job holds at its peak, from the spec
// alone (no tensor is allocated). The controller checks it against the
// workers' memory at submission and when it places stages, a worker checks
// it against its own limit before it builds a stage, and `gpipectl plan`
// ranks configurations by it. One model for all three, so they never
// disagree about whether a job fits.
#ifndef GPIPE_SERVICES_PIPELINE_MEMORY_MODEL_H_
#define GPIPE_SERVICES_PIPELINE_MEMORY_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "gpipe/v1/job.pb.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"

namespace gpipe {

// a + b + ... of non-negative parts, INT64_MAX when it would overflow.
inline int64_t SaturatingSum(std::initializer_list<int64_t> parts) {
  int64_t sum = 0;
  for (int64_t p : parts) {
    if (__builtin_add_overflow(sum, p, &sum))
      return std::numeric_limits<int64_t>::max();
  }
  return sum;
}

// Bytes of one stage during training, by what holds them.
struct StageMemory {
  int64_t parameters = 0;       // values and buffers
  int64_t gradients = 0;        // one accumulator per parameter
  int64_t optimizer_state = 0;  // momentum, or AdamW's two moments
  // Linear weights packed for the CPU GEMM (LayerCost::packed_weight_bytes;
  // an upper bound on a GPU worker, which holds none).
  int64_t packed_weights = 0;
  // What forwards keep for their backwards, for as many micro-batches as
  // the schedule holds at once (under re-materialization: their inputs;
  // with a split backward, what the micro-batches between their halves
  // keep).
  int64_t activations = 0;
  // The rest of a training step's peak, walking the schedule's ops: the
  // running op's own tensors beside what the ops before it left (a
  // re-materialized record, gradients, temporaries).
  int64_t working = 0;
  // A message on its way: the transport's copy (serialized, or being
  // assembled) of the largest tensor the stage sends or receives, a
  // training micro-batch's or an evaluation batch's, outside the stage's
  // allocator.
  int64_t in_flight = 0;
  // The same for an evaluation batch (forward only), between steps, when
  // no activations are kept.
  int64_t evaluation = 0;
  int64_t data = 0;  // the data set and the sampler's permutations
  // The data set's part of `data`, which a worker's chunks share (each has
  // its own sampler).
  int64_t data_set = 0;
  // The step's or an evaluation batch's inputs (first stage) and targets
  // (last stage), whichever is larger: host memory beside the stage's own.
  int64_t batch = 0;

  // What a training step holds on top of the resident state: what the
  // stage's allocator measures (gpipe_stage_activation_memory_bytes).
  // Sums saturate at INT64_MAX, as every part does, so an absurd spec reads
  // as too large, never wraps to a small or negative total.
  int64_t training() const { return SaturatingSum({activations, working}); }
  int64_t total() const {
    return SaturatingSum({parameters, gradients, optimizer_state,
                          packed_weights, data, batch, in_flight,
                          std::max(training(), evaluation)});
  }
  // "1.20 GiB (parameters 400 MiB, gradients 400 MiB, optimizer 800 MiB,
  // packed weights 800 MiB, activations 12.0 MiB, working 3.00 MiB, in
  // flight 1.00 MiB, evaluation 8.00 MiB, batch 3.00 MiB, data 54.9 MiB)".
  std::string ToString() const;
};

// What several stages on one worker (a schedule's chunks) need
// together, part by part: their trainings and their evaluations add up, and
// the worker holds the larger of the two sums (StageMemory::total), not the
// sum of each stage's larger one. The data set counts once: the worker
// opens one for all its chunks (ZB-V's worker 0 holds the first and the
// last stage; a plan by the sum refused jobs that fit by 54 MiB of
// Fashion-MNIST), and each chunk's sampler adds its permutations.
StageMemory Combined(const std::vector<StageMemory>& stages);

// Where the stage sits and how the pipeline runs.
struct StageMemoryPlacement {
  int64_t stage = 0;   // 0-based
  int64_t stages = 1;  // K
  int64_t layer_begin = 0;
  int64_t layer_end = 0;
  int64_t micro_batches = 1;  // M
  ScheduleKind schedule = ScheduleKind::kGPipe;
  // Chunks per worker under an interleaved schedule: `stages` counts them
  // all (K x v), and a worker holds v of these estimates at once.
  int64_t virtual_stages = 1;
  RematMode remat = RematMode::kExceptLast;
  // ZB-V's phase times, which its order follows (the assignment's, or
  // CostModelTicks of the partition); empty: equal times.
  std::vector<PhaseTicks> order_ticks;
  // The stage's worker's ops, when the caller has them (every worker's
  // come from one ZB-V order: EstimatePipelineMemory builds it once, not
  // once a stage, which took minutes at K=128, M=1024); null: built here.
  const std::vector<Op>* worker_ops = nullptr;
};

// Bytes that a training forward of layers [begin, end) keeps for the
// backward of one micro-batch of `samples`, with every boundary tensor
// counted once (a layer's output kept by it and the next layer's input kept
// by that layer are one tensor). The stage's input counts when its first
// layer keeps it; its output when its last layer does.
int64_t SavedActivationBytes(const ModelShapes& shapes, int64_t begin,
                             int64_t end, int64_t samples);

// The model for one stage of `spec` (already validated; `shapes` its model's
// shapes). Data is counted for the spec's data source as far as the spec
// tells it (a text file's size is not known before it is opened: 0).
StageMemory EstimateStageMemory(const gpipe::v1::JobSpec& spec,
                                const ModelShapes& shapes,
                                const StageMemoryPlacement& placement);

// Every stage of `spec` cut by `balance`, with M micro-batches, `schedule`
// and `remat` (the planner tries others than the spec's); under an
// interleaved schedule `balance` has K x v chunks, one estimate each.
// `worker_ops`: every worker's ops where the caller has built them already
// (MakeWorkerSchedules of these K, M, v and the cost model's ticks), as the
// planner has for its simulation; null: built here.
std::vector<StageMemory> EstimatePipelineMemory(
    const gpipe::v1::JobSpec& spec, const ModelShapes& shapes,
    const std::vector<int64_t>& balance, int64_t micro_batches,
    ScheduleKind schedule, RematMode remat, int64_t virtual_stages = 1,
    const std::vector<std::vector<Op>>* worker_ops = nullptr);
// The same with the spec's M, schedule and re-materialization.
std::vector<StageMemory> EstimatePipelineMemory(
    const gpipe::v1::JobSpec& spec, const ModelShapes& shapes,
    const std::vector<int64_t>& balance);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_MEMORY_MODEL_H_
