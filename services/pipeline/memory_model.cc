#include "services/pipeline/memory_model.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "services/core/bytes.h"
#include "services/pipeline/job_spec.h"

namespace gpipe {
namespace {

namespace v1 = gpipe::v1;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// Saturating, so that an absurd spec reads as "too large", never wraps.
int64_t Add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? kMax : r;
}
int64_t Mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? kMax : r;
}

// Fashion-MNIST's train and test images and labels, one byte each.
constexpr int64_t kFashionMnistBytes = (60000 + 10000) * (28 * 28 + 1);
constexpr int64_t kFashionMnistTrain = 60000;
// The sampler keeps two epochs' permutations and may build a third.
constexpr int64_t kPermutations = 3;

int64_t BoundaryBytes(const ModelShapes& shapes, int64_t j, int64_t end) {
  const Shape& s = j < end ? shapes.inputs[j] : shapes.outputs[end - 1];
  return Mul(s.numel(), 4);  // f32 activations and int32 ids alike
}

// What layers keep of a micro-batch: after its forward (for the backward),
// or after a split backward's input half (for the weight half).
enum class Kept { kForBackward, kForWeightHalf };

// SavedActivationBytes, leaving the stage's input out when `count_input` is
// false (the first stage's input is a view of the step's batch).
int64_t KeptBytes(const ModelShapes& shapes, int64_t begin, int64_t end,
                  int64_t samples, bool count_input,
                  Kept what = Kept::kForBackward) {
  const bool weight = what == Kept::kForWeightHalf;
  const auto keeps_input = [&](int64_t l) {
    return weight ? shapes.costs[l].weight_keeps_input
                  : shapes.costs[l].keeps_input;
  };
  const auto keeps_output = [&](int64_t l) {
    return !weight && shapes.costs[l].keeps_output;
  };
  int64_t per_sample = 0, fixed = 0;
  // Boundary j is layer j's input and layer j-1's output; a layer whose
  // output is a view of its input joins its two boundaries into one tensor.
  bool kept = false;
  bool group_has_input = true;  // the group holds boundary `begin`
  for (int64_t j = begin; j <= end; ++j) {
    const bool alias = j > begin && shapes.costs[j - 1].output_is_input;
    if (j > begin && !alias) {
      if (kept && (count_input || !group_has_input)) {
        per_sample = Add(per_sample, BoundaryBytes(shapes, j - 1, end));
      }
      kept = false;
      group_has_input = false;
    }
    kept = kept || (j < end && keeps_input(j)) ||
           (j > begin && keeps_output(j - 1));
  }
  if (kept && (count_input || !group_has_input)) {
    per_sample = Add(per_sample, BoundaryBytes(shapes, end, end));
  }
  for (int64_t l = begin; l < end; ++l) {
    const LayerCost& c = shapes.costs[l];
    per_sample = Add(per_sample, weight ? c.weight_saved_bytes : c.saved_bytes);
    if (!weight) fixed = Add(fixed, c.saved_fixed_bytes);
  }
  return Add(Mul(per_sample, samples), fixed);
}

int64_t TrainSamples(const v1::DataSpec& data) {
  if (data.has_synthetic()) return data.synthetic().train_samples();
  if (data.has_fashion_mnist()) return kFashionMnistTrain;
  return 0;  // a text file's size is known once it is opened
}

int64_t DatasetBytes(const v1::DataSpec& data) {
  if (data.has_fashion_mnist()) return kFashionMnistBytes;
  return 0;  // synthetic samples are made on demand
}

// Targets per sample: one class, or one per position of a [T, V] output.
int64_t TargetBytesPerSample(const ModelShapes& shapes) {
  const Shape& out = shapes.outputs.back();
  return out.rank() >= 2 ? Mul(out.numel() / out.dims().back(), 4) : 4;
}

// The largest op of layers [begin, end) on `samples`: a forward holds its
// input, its output and its temporaries (LayerCost::forward_temp_bytes; in
// training only a convolution's columns, since what else a training forward
// makes it keeps, and the activations count that); a backward the output's
// gradient and the input's with the layer's workspace.
// A forward's input at layer `begin` is the stage's input, which the caller
// counts (the message received, or the batch).
enum class OpPass { kTrainingForward, kEvaluation, kBackward };

int64_t LargestOp(const ModelShapes& shapes, int64_t begin, int64_t end,
                  int64_t samples, OpPass pass) {
  const bool backward = pass == OpPass::kBackward;
  int64_t most = 0;
  for (int64_t l = begin; l < end; ++l) {
    const LayerCost& c = shapes.costs[l];
    // A forward's input at the stage's first layer is counted by the
    // caller; the model's first layer computes no input gradient.
    const bool no_input = backward ? !InputGradUsed(l) : l == begin;
    const int64_t per_sample =
        Add(no_input ? 0 : Mul(shapes.inputs[l].numel(), 4),
            Mul(shapes.outputs[l].numel(), 4));
    // Chunked layers hold the temporaries of one chunk of samples.
    const int64_t in_chunk = c.workspace_samples > 0
                                 ? std::min(samples, c.workspace_samples)
                                 : samples;
    int64_t temporaries = 0;
    if (backward) {
      temporaries = Mul(c.workspace_bytes, in_chunk);
    } else if (pass == OpPass::kEvaluation || c.workspace_samples > 0) {
      temporaries = Mul(c.forward_temp_bytes, in_chunk);
    }
    // Per-channel statistics and the like, made in any pass.
    if (pass == OpPass::kEvaluation)
      temporaries = Add(temporaries, c.saved_fixed_bytes);
    most = std::max(most, Add(Mul(per_sample, samples), temporaries));
  }
  return most;
}

}  // namespace

std::string StageMemory::ToString() const {
  return absl::StrCat(
      FormatBytes(total()), " (parameters ", FormatBytes(parameters),
      ", gradients ", FormatBytes(gradients), ", optimizer ",
      FormatBytes(optimizer_state), ", activations ", FormatBytes(activations),
      ", working ", FormatBytes(working), ", evaluation ",
      FormatBytes(evaluation), ", batch ", FormatBytes(batch), ", data ",
      FormatBytes(data), ")");
}

int64_t SavedActivationBytes(const ModelShapes& shapes, int64_t begin,
                             int64_t end, int64_t samples) {
  return KeptBytes(shapes, begin, end, samples, /*count_input=*/true);
}

StageMemory EstimateStageMemory(const v1::JobSpec& spec,
                                const ModelShapes& shapes,
                                const StageMemoryPlacement& p) {
  StageMemory out;
  const int64_t b = p.layer_begin, e = p.layer_end;
  const bool first = p.stage == 0, last = p.stage == p.stages - 1;
  int64_t params = 0, buffers = 0;
  for (int64_t l = b; l < e; ++l) {
    params = Add(params, shapes.costs[l].param_bytes);
    buffers = Add(buffers, shapes.costs[l].buffer_bytes);
  }
  out.parameters = Add(params, buffers);
  out.gradients = params;
  const v1::OptimizerSpec& opt = spec.optimizer();
  if (opt.has_adamw()) {
    out.optimizer_state = Mul(params, 2);
  } else if (opt.sgd().momentum() > 0) {
    out.optimizer_state = params;
  }

  const int64_t batch = spec.batch_size();
  const int64_t m = std::max<int64_t>(1, p.micro_batches);
  const int64_t mb = (batch + m - 1) / m;  // the largest micro-batch
  const bool remat = StageRematerializes(p.remat, p.stage, p.stages);
  // Under an interleaved schedule the stage is chunk stage / K of worker
  // stage % K, and holds what that chunk's ops in the worker's list hold.
  const int64_t v = std::max<int64_t>(1, p.virtual_stages);
  const int64_t workers = std::max<int64_t>(1, p.stages / v);
  const std::vector<Op> ops = MakeWorkerSchedule(
      p.schedule, workers, p.micro_batches, v, p.stage % workers);
  const int64_t chunk = p.stage / workers;
  const int64_t in_bytes = Mul(BoundaryBytes(shapes, b, e), mb);
  const int64_t out_bytes = Mul(BoundaryBytes(shapes, e, e), mb);
  const int64_t full = KeptBytes(shapes, b, e, mb, /*count_input=*/!first);
  // Kept per micro-batch between its forward and its backward: everything,
  // or only the input (the first stage's is part of the batch); the last
  // stage also keeps the loss gradient.
  int64_t per_micro_batch = remat ? (first ? 0 : in_bytes) : full;
  if (last) per_micro_batch = Add(per_micro_batch, out_bytes);
  if (!SplitsBackward(p.schedule)) {
    // Under re-materialization one micro-batch at a time is recomputed
    // whole for its backward.
    out.activations = Add(Mul(per_micro_batch, MaxLiveMicroBatches(ops, chunk)),
                          remat ? full : 0);
  } else {
    // A micro-batch between its halves keeps what the weight half reads
    // and its GEMMs' output gradients; while its input half runs, its whole
    // record (recomputed under remat) beside the gradients it makes.
    int64_t gradients = 0;
    for (int64_t l = b; l < e; ++l)
      gradients = Add(gradients, Mul(shapes.costs[l].deferred_bytes, mb));
    const int64_t per_deferred = Add(
        KeptBytes(shapes, b, e, mb, !first, Kept::kForWeightHalf), gradients);
    int64_t waiting = 0, deferred = 0, peak = 0;
    const auto held = [&] {
      return Add(Mul(per_micro_batch, waiting), Mul(per_deferred, deferred));
    };
    for (const Op& op : ops) {
      if (op.chunk != chunk) continue;
      if (op.kind == OpKind::kForward) {
        ++waiting;
        peak = std::max(peak, held());
      } else if (op.kind == OpKind::kBackwardInput) {
        --waiting;
        const int64_t record =
            remat ? Add(full, first ? 0 : in_bytes) : per_micro_batch;
        peak = std::max(peak, Add(Add(held(), record), gradients));
        ++deferred;
      } else if (op.kind == OpKind::kBackwardWeight) {
        --deferred;
      }
    }
    out.activations = peak;
  }

  // One op at a time beside the activations, and the last activation sent
  // while it waits for the next stage to take it. The messages received are
  // among the others: the activation is the input the forward keeps, the
  // gradient the backward's output gradient.
  int64_t train =
      Add(std::max(LargestOp(shapes, b, e, mb, OpPass::kTrainingForward),
                   LargestOp(shapes, b, e, mb, OpPass::kBackward)),
          last ? 0 : out_bytes);
  // An evaluation batch goes through whole: the stage's input beside its
  // largest forward.
  const int64_t eval_batch =
      spec.eval().batch_size() > 0 ? spec.eval().batch_size() : batch;
  int64_t eval = Add(LargestOp(shapes, b, e, eval_batch, OpPass::kEvaluation),
                     first ? 0 : Mul(BoundaryBytes(shapes, b, e), eval_batch));
  if (last) {
    // The loss's probabilities beside the logits.
    train = Add(train, out_bytes);
    eval = Add(eval, Mul(BoundaryBytes(shapes, e, e), eval_batch));
  }
  // Several gradient groups on one stage: the sums GradientTree holds
  // until the step's end, from the first group's end on, beside the
  // activations, as the allocator sees. Siblings merge at once, so L groups
  // leave at most floor(log2 L) + 1 nodes, and a run that starts off a
  // boundary (an uneven share) one more, the newest included.
  const int64_t replicas = ReplicaCount(spec);
  // The largest share: one group more than G / R when R does not divide G.
  const int64_t local_groups =
      (GradientGroupCount(spec) + replicas - 1) / replicas;
  int64_t nodes = 0;
  if (local_groups > 1) {
    nodes = 2;
    for (int64_t l = local_groups; l > 1; l /= 2) ++nodes;
    train = Add(train, Mul(params, nodes));
  }
  // Replicas summing over links (LinkReduction), n nodes a replica: the
  // slices it sends ((R-1)/R of n gradient copies), its slice of every
  // replica's nodes (R n slices of 1/R), one received message and the total
  // (1/R each): within 2n + 1 copies. The in-memory sum needs none: an
  // upper bound there.
  if (replicas > 1) {
    train = Add(train, Mul(params, 2 * std::max<int64_t>(1, nodes) + 1));
  }
  out.working = train;
  out.evaluation = eval;
  // The step's (or the evaluation's) inputs and targets, gathered on the
  // host by the first and the last stage.
  const int64_t sample_in = BoundaryBytes(shapes, 0, shapes.inputs.size());
  const int64_t per_sample =
      Add(first ? sample_in : 0, last ? TargetBytesPerSample(shapes) : 0);
  out.batch = Mul(per_sample, std::max(batch, eval_batch));

  if (first || last) {
    out.data = Add(DatasetBytes(spec.data()),
                   Mul(Mul(TrainSamples(spec.data()), 8), kPermutations));
  }
  return out;
}

StageMemory Combined(const std::vector<StageMemory>& stages) {
  StageMemory w;
  for (const StageMemory& c : stages) {
    for (auto [to, from] : {std::pair{&w.parameters, c.parameters},
                            {&w.gradients, c.gradients},
                            {&w.optimizer_state, c.optimizer_state},
                            {&w.activations, c.activations},
                            {&w.working, c.working},
                            {&w.evaluation, c.evaluation},
                            {&w.data, c.data},
                            {&w.batch, c.batch}}) {
      *to = Add(*to, from);
    }
  }
  return w;
}

std::vector<StageMemory> EstimatePipelineMemory(
    const v1::JobSpec& spec, const ModelShapes& shapes,
    const std::vector<int64_t>& balance) {
  return EstimatePipelineMemory(spec, shapes, balance, MicroBatchCount(spec),
                                ScheduleFromSpec(spec.pipeline().schedule()),
                                RematFromSpec(spec.pipeline().remat()),
                                VirtualStageCount(spec));
}

std::vector<StageMemory> EstimatePipelineMemory(
    const v1::JobSpec& spec, const ModelShapes& shapes,
    const std::vector<int64_t>& balance, int64_t micro_batches,
    ScheduleKind schedule, RematMode remat, int64_t virtual_stages) {
  std::vector<StageMemory> out;
  int64_t begin = 0;
  for (size_t s = 0; s < balance.size(); ++s) {
    StageMemoryPlacement p;
    p.stage = static_cast<int64_t>(s);
    p.stages = static_cast<int64_t>(balance.size());
    p.layer_begin = begin;
    p.layer_end = begin + balance[s];
    p.micro_batches = micro_batches;
    p.schedule = schedule;
    p.virtual_stages = Interleaves(schedule) ? virtual_stages : 1;
    p.remat = remat;
    out.push_back(EstimateStageMemory(spec, shapes, p));
    begin = p.layer_end;
  }
  return out;
}

}  // namespace gpipe
