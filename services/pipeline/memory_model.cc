#include "services/pipeline/memory_model.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "services/core/bytes.h"
#include "services/nn/weight_groups.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/simulator.h"

namespace gpipe {
namespace {

namespace v1 = gpipe::v1;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// Saturating, so that an absurd spec reads as "too large", never wraps.
int64_t Add(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? kMax : r;
}
// a - b, never below 0, and kMax ("too large") stays kMax.
int64_t Less(int64_t a, int64_t b) {
  return a == kMax ? kMax : std::max<int64_t>(0, a - b);
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

// For each boundary j of [begin, end] (at j - begin; boundary j is layer
// j's input and layer j-1's output), whether a record holds its tensor:
// layers [begin, weight_from) keep theirs for the backward, layers
// [weight_from, end) for their weight halves (a split backward's input
// half has passed them). A layer whose output is a view of its input joins
// its two boundaries into one tensor, held when any layer keeps any of it.
std::vector<char> KeptBoundaries(const ModelShapes& shapes, int64_t begin,
                                 int64_t end, int64_t weight_from) {
  std::vector<char> kept(end - begin + 1, 0);
  int64_t group = begin;  // the first boundary of the current group
  bool any = false;
  const auto close = [&](int64_t past) {
    for (int64_t j = group; j < past; ++j) kept[j - begin] = any;
  };
  for (int64_t j = begin; j <= end; ++j) {
    if (j > begin && !shapes.costs[j - 1].output_is_input) {
      close(j);
      group = j;
      any = false;
    }
    if (j < end) {
      const LayerCost& in = shapes.costs[j];
      any = any || (j >= weight_from ? in.weight_keeps_input : in.keeps_input);
    }
    if (j > begin)
      any = any || (j - 1 < weight_from && shapes.costs[j - 1].keeps_output);
  }
  close(end + 1);
  return kept;
}

// SavedActivationBytes, leaving the stage's input out when `count_input` is
// false (the first stage's input is a view of the step's batch), with the
// records of layers from `weight_from` on their weight halves' (as
// KeptBoundaries). Each group of joined boundaries counts once.
int64_t KeptBytesFrom(const ModelShapes& shapes, int64_t begin, int64_t end,
                      int64_t samples, bool count_input, int64_t weight_from) {
  const auto weight = [&](int64_t l) { return l >= weight_from; };
  const std::vector<char> kept =
      KeptBoundaries(shapes, begin, end, weight_from);
  int64_t per_sample = 0, fixed = 0;
  bool with_input = true;  // the group holds boundary `begin`
  for (int64_t j = begin; j <= end; ++j) {
    if (j > begin && !shapes.costs[j - 1].output_is_input) with_input = false;
    const bool group_end = j == end || !shapes.costs[j].output_is_input;
    if (group_end && kept[j - begin] && (count_input || !with_input))
      per_sample = Add(per_sample, BoundaryBytes(shapes, j, end));
  }
  for (int64_t l = begin; l < end; ++l) {
    const LayerCost& c = shapes.costs[l];
    per_sample =
        Add(per_sample, weight(l) ? c.weight_saved_bytes : c.saved_bytes);
    if (!weight(l)) fixed = Add(fixed, c.saved_fixed_bytes);
  }
  return Add(Mul(per_sample, samples), fixed);
}

// KeptBytesFrom of one stage as its weight halves take the layers over, one
// at a time from the last (weight_from from `end` down to `begin`): each
// handover changes one layer's own bytes and at most two groups of joined
// boundaries, so the record is kept up to date instead of walked again (the
// walk per layer made InputHalfPeak quadratic in the stage's layers, a
// minute of `gpipectl plan` on a model of 10,000 layers). The same sums,
// in 128 bits; where one reaches KeptBytesFrom's saturation it answers.
class WeightHalvesRecord {
 public:
  WeightHalvesRecord(const ModelShapes& shapes, int64_t begin, int64_t end,
                     bool count_input)
      : shapes_(shapes),
        begin_(begin),
        end_(end),
        count_input_(count_input),
        weight_from_(end),
        group_(end - begin + 1) {
    int64_t g = 0;
    for (int64_t j = begin; j <= end; ++j) {
      if (j > begin && !shapes.costs[j - 1].output_is_input) ++g;
      group_[j - begin] = g;
      const bool group_end = j == end || !shapes.costs[j].output_is_input;
      if (group_end) {
        // Only the first group holds the stage's input.
        bytes_.push_back(count_input || g > 0 ? BoundaryBytes(shapes, j, end)
                                              : 0);
      }
    }
    reasons_.assign(bytes_.size(), 0);
    for (int64_t l = begin; l < end; ++l) {
      const LayerCost& c = shapes.costs[l];
      Count(l, c.keeps_input ? 1 : 0);
      Count(l + 1, c.keeps_output ? 1 : 0);
      layers_ += c.saved_bytes;
      fixed_ += c.saved_fixed_bytes;
    }
  }

  // Layer weight_from - 1's weight half keeps its record from now on.
  void HandOver() {
    const int64_t l = --weight_from_;
    const LayerCost& c = shapes_.costs[l];
    Count(l, (c.weight_keeps_input ? 1 : 0) - (c.keeps_input ? 1 : 0));
    Count(l + 1, c.keeps_output ? -1 : 0);
    layers_ += static_cast<__int128>(c.weight_saved_bytes) - c.saved_bytes;
    fixed_ -= c.saved_fixed_bytes;
  }

  int64_t Bytes(int64_t samples) const {
    const __int128 per_sample = boundaries_ + layers_;
    if (per_sample >= kMax || fixed_ >= kMax) {
      return KeptBytesFrom(shapes_, begin_, end_, samples, count_input_,
                           weight_from_);
    }
    return Add(Mul(static_cast<int64_t>(per_sample), samples),
               static_cast<int64_t>(fixed_));
  }

 private:
  // `delta` reasons more (or fewer) to keep boundary j's group.
  void Count(int64_t j, int delta) {
    if (delta == 0) return;
    const int64_t g = group_[j - begin_];
    const bool was = reasons_[g] > 0;
    reasons_[g] += delta;
    const bool is = reasons_[g] > 0;
    if (was != is) boundaries_ += is ? bytes_[g] : -bytes_[g];
  }

  const ModelShapes& shapes_;
  int64_t begin_, end_;
  bool count_input_;
  int64_t weight_from_;
  std::vector<int64_t> group_;    // boundary j - begin's group
  std::vector<int64_t> bytes_;    // a group's tensor, where it counts
  std::vector<int64_t> reasons_;  // layers that keep a group's tensor
  __int128 boundaries_ = 0, layers_ = 0, fixed_ = 0;
};

int64_t KeptBytes(const ModelShapes& shapes, int64_t begin, int64_t end,
                  int64_t samples, bool count_input,
                  Kept what = Kept::kForBackward) {
  return KeptBytesFrom(shapes, begin, end, samples, count_input,
                       what == Kept::kForWeightHalf ? begin : end);
}

int64_t TrainSamples(const v1::DataSpec& data) {
  if (data.has_synthetic()) return data.synthetic().train_samples();
  if (data.has_fashion_mnist()) return kFashionMnistTrain;
  return 0;  // a text file's size is known once it is opened
}

int64_t DatasetBytes(const v1::DataSpec& data) {
  if (data.has_fashion_mnist()) return kFashionMnistBytes;
  // Synthetic samples are made on demand, but the Gaussian classes' centres
  // (features x classes floats, up to 1 GiB) are kept: uncounted, a worker
  // under a 300 MiB limit held 1.1 GB.
  if (data.has_synthetic() && data.synthetic().task() == v1::CLASSES) {
    return Mul(Mul(std::max<int64_t>(0, data.synthetic().features()),
                   std::max<int64_t>(0, data.synthetic().classes())),
               4);
  }
  return 0;
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
// Chunked layers hold the temporaries of one chunk of samples.
int64_t ChunkSamples(const LayerCost& c, int64_t samples) {
  return c.workspace_samples > 0 ? std::min(samples, c.workspace_samples)
                                 : samples;
}

// A backward's output gradient and the input gradient it makes, per
// sample: none made by a view's (it hands its output gradient on) or the
// model's first layer's.
int64_t GradientsPerSample(const ModelShapes& shapes, int64_t l) {
  if (shapes.costs[l].output_is_input) return 0;
  return Add(InputGradUsed(l) ? Mul(shapes.inputs[l].numel(), 4) : 0,
             Mul(shapes.outputs[l].numel(), 4));
}

// kUnkeptForward: a training forward that keeps no record (the first
// under re-materialization): its temporaries pass as an evaluation's.
enum class OpPass { kTrainingForward, kUnkeptForward, kEvaluation, kBackward };

// `kept` (KeptBoundaries, for a forward that keeps its record): the
// boundaries the activations count already, left out of the op.
// `stage_grad`: a backward's output gradient, which the stage holds until
// its last layer is done, beside every layer's but the stage's last.
int64_t LargestOp(const ModelShapes& shapes, int64_t begin, int64_t end,
                  int64_t samples, OpPass pass,
                  const std::vector<char>* kept = nullptr,
                  int64_t stage_grad = 0) {
  const bool backward = pass == OpPass::kBackward;
  // A layer whose output is its input (a view; in an evaluation also a
  // layer that hands its input on) makes no tensor: its output is the
  // tensor before it.
  const auto passes_input = [&](const LayerCost& c) {
    return c.output_is_input ||
           (pass == OpPass::kEvaluation && c.evaluation_passes_input);
  };
  // Whether layer l's input is the stage's input, which the caller counts.
  bool stage_input = true;
  int64_t most = 0;
  for (int64_t l = begin; l < end; ++l) {
    const LayerCost& c = shapes.costs[l];
    if (l > begin && !passes_input(shapes.costs[l - 1])) stage_input = false;
    const bool no_input = stage_input || (kept && (*kept)[l - begin]);
    const bool no_output = passes_input(c) || (kept && (*kept)[l + 1 - begin]);
    const int64_t per_sample =
        backward ? GradientsPerSample(shapes, l)
                 : Add(no_input ? 0 : Mul(shapes.inputs[l].numel(), 4),
                       no_output ? 0 : Mul(shapes.outputs[l].numel(), 4));
    const int64_t in_chunk = ChunkSamples(c, samples);
    int64_t temporaries = 0;
    if (backward) {
      // Without an input gradient only the weight gradient's part runs.
      temporaries =
          Mul(!InputGradUsed(l) && c.splits_workspace ? c.weight_workspace_bytes
                                                      : c.workspace_bytes,
              in_chunk);
    } else if (pass != OpPass::kTrainingForward || c.workspace_samples > 0) {
      temporaries = Mul(c.forward_temp_bytes, in_chunk);
    }
    // Per-channel statistics and the like, made in any pass.
    if (pass == OpPass::kEvaluation || pass == OpPass::kUnkeptForward)
      temporaries = Add(temporaries, c.saved_fixed_bytes);
    if (backward && l + 1 < end) temporaries = Add(temporaries, stage_grad);
    most = std::max(most, Add(Mul(per_sample, samples), temporaries));
  }
  return most;
}

// The most a split backward's input half holds beyond the rest of the
// stage, over layers [begin, end): walking them last to first, each
// layer's own op (LargestOp's backward terms) beside the micro-batch's
// record, the stage's output gradient (held to the end) and the deferred
// gradients the layers after it kept for their weight halves. A layer's
// input half lets go of what its weight half does not read, so the layers
// after it hold their weight halves' records only. A layer that defers
// its output gradient keeps the tensor it was handed: the stage's own, at
// the last.
int64_t InputHalfPeak(const ModelShapes& shapes, int64_t begin, int64_t end,
                      int64_t samples, bool count_input, int64_t stage_grad) {
  int64_t most = 0, later = 0;
  WeightHalvesRecord kept_record(shapes, begin, end, count_input);
  for (int64_t l = end - 1; l >= begin; --l) {
    const LayerCost& c = shapes.costs[l];
    const int64_t per_sample = GradientsPerSample(shapes, l);
    const int64_t in_chunk = ChunkSamples(c, samples);
    // Layers past l hand their records to their weight halves.
    if (l + 1 < end) kept_record.HandOver();
    const int64_t record = kept_record.Bytes(samples);
    const int64_t beside =
        Add(Add(later, record), l + 1 < end ? stage_grad : 0);
    const int64_t workspace = !InputGradUsed(l)    ? 0
                              : c.splits_workspace ? c.input_workspace_bytes
                                                   : c.workspace_bytes;
    most = std::max(
        most,
        Add(Add(Mul(per_sample, samples), Mul(workspace, in_chunk)), beside));
    int64_t kept = Mul(c.deferred_bytes, samples);
    if (l + 1 == end && c.defers_output_grad)
      kept = std::max<int64_t>(0, kept - stage_grad);
    later = Add(later, kept);
  }
  return most;
}

// The most a weight half holds beyond the record: its largest layer's
// temporaries.
int64_t WeightHalfPeak(const ModelShapes& shapes, int64_t begin, int64_t end,
                       int64_t samples) {
  int64_t most = 0;
  for (int64_t l = begin; l < end; ++l) {
    const LayerCost& c = shapes.costs[l];
    most =
        std::max(most, Mul(c.weight_workspace_bytes, ChunkSamples(c, samples)));
  }
  return most;
}

// What a CPU stage's grouped weight halves hold (Stage::WeightGroupSize,
// weight_groups.h) with micro-batches of `samples`: the micro-batches a
// group takes, what each holds until its group runs (its grouping layers'
// operands), and the largest layer's operands gathered for one micro-batch
// (a group's product holds them gathered, `size` times that).
struct WeightGrouping {
  int64_t size = 1;
  int64_t held = 0;
  int64_t gathered = 0;
};

WeightGrouping GroupedWeights(const ModelShapes& shapes, int64_t begin,
                              int64_t end, int64_t samples, int64_t per_group) {
  WeightGrouping out;
  std::vector<WeightGroupCost> costs;
  for (int64_t l = begin; l < end; ++l) {
    const LayerCost& c = shapes.costs[l];
    if (c.weight_group_rows <= 0) continue;
    costs.push_back({Mul(c.weight_group_rows, samples),
                     Mul(c.weight_group_held_bytes, samples), c.param_bytes});
    out.held = Add(out.held, Mul(c.weight_group_held_bytes, samples));
    out.gathered =
        std::max(out.gathered, Mul(c.weight_group_held_bytes, samples));
  }
  out.size = std::min(std::max<int64_t>(1, per_group), WeightGroupSize(costs));
  return out;
}

// Whether micro-batch m's weight half ends a group: the group is full, or
// m ends a gradient group or the step.
bool EndsWeightGroup(int64_t members, int64_t m, int64_t size,
                     int64_t per_group, int64_t micro_batches) {
  return members >= size || (m + 1) % per_group == 0 || m + 1 == micro_batches;
}

}  // namespace

std::string StageMemory::ToString() const {
  return absl::StrCat(
      FormatBytes(total()), " (parameters ", FormatBytes(parameters),
      ", gradients ", FormatBytes(gradients), ", optimizer ",
      FormatBytes(optimizer_state), ", packed weights ",
      FormatBytes(packed_weights), ", activations ", FormatBytes(activations),
      ", working ", FormatBytes(working), ", in flight ",
      FormatBytes(in_flight), ", evaluation ", FormatBytes(evaluation),
      ", batch ", FormatBytes(batch), ", data ", FormatBytes(data), ")");
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
    out.packed_weights =
        Add(out.packed_weights, shapes.costs[l].packed_weight_bytes);
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
  // Under a schedule with chunks the stage is one chunk of a worker (as the
  // schedule places it), and holds what that chunk's ops in the worker's
  // list hold.
  const int64_t v = std::max<int64_t>(1, p.virtual_stages);
  const int64_t workers = std::max<int64_t>(1, p.stages / v);
  const std::vector<Op> ops =
      p.worker_ops != nullptr
          ? *p.worker_ops
          : MakeWorkerSchedule(p.schedule, workers, p.micro_batches, v,
                               WorkerOfStage(p.schedule, workers, p.stage),
                               p.order_ticks);
  const int64_t chunk = ChunkOfStage(p.schedule, workers, p.stage);
  const int64_t in_bytes = Mul(BoundaryBytes(shapes, b, e), mb);
  const int64_t out_bytes = Mul(BoundaryBytes(shapes, e, e), mb);
  const int64_t full = KeptBytes(shapes, b, e, mb, /*count_input=*/!first);
  // Kept per micro-batch between its forward and its backward: everything,
  // or only the input (the first stage's is part of the batch); the last
  // stage also keeps the loss gradient.
  int64_t per_micro_batch = remat ? (first ? 0 : in_bytes) : full;
  if (last) per_micro_batch = Add(per_micro_batch, out_bytes);
  // Under re-materialization a micro-batch's record is rebuilt whole for
  // its backward, beside the input it kept.
  const int64_t rebuilt = KeptBytes(shapes, b, e, mb, /*count_input=*/false);

  // The ops' own memory beside what the stage holds. The messages a stage
  // receives are among what it holds (a forward's input, or kept) or the
  // backward's output gradient; what it sends leaves its allocator when
  // the link takes it (serialized, or copied into a ring), and the
  // transport's copy is host memory beside the stage's (in_flight).
  //
  // A forward that keeps its record turns its kept tensors into the
  // activations; a forward's input at the stage's first layer is among
  // them when the record or re-materialization keeps it (the first
  // stage's is a view of the batch). Under re-materialization the first
  // forward keeps nothing: an evaluation's forward.
  const std::vector<char> kept =
      KeptBoundaries(shapes, b, e, /*weight_from=*/e);
  const int64_t keeping_forward =
      LargestOp(shapes, b, e, mb, OpPass::kTrainingForward, &kept);
  // The last stage's loss: the probabilities beside the logits (the loss
  // gradient is among the activations).
  const int64_t forward_op =
      Add(remat ? LargestOp(shapes, b, e, mb, OpPass::kUnkeptForward)
                : Add(keeping_forward, first || kept[0] ? 0 : in_bytes),
          last ? out_bytes : 0);
  // Re-materialization runs the forward again, keeping, with the output
  // gradient received.
  const int64_t recompute =
      remat ? Add(Add(rebuilt, keeping_forward), last ? 0 : out_bytes) : 0;
  // The backward holds its output gradient to the end, and its record:
  // rebuilt under re-materialization with the input when a layer keeps it
  // (else let go after the recompute); the last stage's loss gradient is
  // the output gradient.
  const int64_t backward_op =
      LargestOp(shapes, b, e, mb, OpPass::kBackward, nullptr, out_bytes);
  const int64_t record = remat ? full : per_micro_batch;
  // The last stage's loss gradient, counted in per_micro_batch but not in
  // the re-materialized record.
  const int64_t own_grad = last && !remat ? out_bytes : 0;
  int64_t train = 0;
  const int64_t per_group =
      std::max<int64_t>(1, m / std::max<int64_t>(1, GradientGroupCount(spec)));
  const WeightGrouping grouping = GroupedWeights(shapes, b, e, mb, per_group);
  // Whole backwards group their weight halves only without
  // re-materialization, and only all of a gradient group's
  // (Stage::WeightGroupSize).
  const int64_t whole_size = WholeBackwardsGroupSize(grouping.size, per_group);
  if (!SplitsBackward(p.schedule) && (whole_size == 1 || remat)) {
    const int64_t live = MaxLiveMicroBatches(ops, chunk);
    out.activations = Mul(per_micro_batch, live);
    const int64_t others = Mul(per_micro_batch, std::max<int64_t>(0, live - 1));
    train = std::max({Add(out.activations, forward_op),
                      Add(out.activations, recompute),
                      Less(Add(Add(others, record), backward_op), own_grad)});
  } else if (!SplitsBackward(p.schedule)) {
    // Whole backwards whose grouping layers' weight halves wait for their
    // group's last (Stage::RunWeightGroup): walk the ops, each moment the
    // stage holding its live micro-batches' records and the waiting ones'
    // operands beside the running op's own.
    int64_t live = 0, waiting = 0;
    const auto held = [&](int64_t records) {
      return Add(Mul(per_micro_batch, records), Mul(grouping.held, waiting));
    };
    for (const Op& op : ops) {
      if (op.chunk != chunk) continue;
      if (op.kind == OpKind::kForward) {
        ++live;
        out.activations = std::max(out.activations, held(live));
        train = std::max(train, Add(held(live), forward_op));
      } else if (op.kind == OpKind::kBackward) {
        train = std::max(train, Add(held(live), recompute));
        train = std::max(
            train,
            Less(Add(Add(held(live - 1), record), backward_op), own_grad));
        --live;
        ++waiting;
        if (EndsWeightGroup(waiting, op.micro_batch, whole_size, per_group,
                            m)) {
          // One alone is not gathered (Linear::BackwardWeights).
          train = std::max(
              train, Add(held(live),
                         waiting > 1 ? Mul(grouping.gathered, waiting) : 0));
          waiting = 0;
        }
        out.activations = std::max(out.activations, held(live));
      }
    }
  } else {
    // A micro-batch between its halves keeps what the weight half reads
    // and its GEMMs' output gradients; while its input half runs, its
    // record beside the gradients it makes. Walk the ops: each moment the
    // stage holds what the ops before left, beside the running op's own.
    int64_t gradients = 0;
    for (int64_t l = b; l < e; ++l)
      gradients = Add(gradients, Mul(shapes.costs[l].deferred_bytes, mb));
    const int64_t per_deferred = Add(
        KeptBytes(shapes, b, e, mb, !first, Kept::kForWeightHalf), gradients);
    // The record, the input when a layer keeps it (under
    // re-materialization, rebuilt), and the loss gradient as the output
    // gradient.
    const int64_t input_half =
        InputHalfPeak(shapes, b, e, mb, /*count_input=*/!first, out_bytes);
    const int64_t weight_half = WeightHalfPeak(shapes, b, e, mb);
    int64_t waiting = 0, deferred = 0;
    const auto held = [&] {
      return Add(Mul(per_micro_batch, waiting), Mul(per_deferred, deferred));
    };
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      if (op.chunk != chunk) continue;
      if (op.kind == OpKind::kForward) {
        ++waiting;
        out.activations = std::max(out.activations, held());
        train = std::max(train, Add(held(), forward_op));
      } else if (op.kind == OpKind::kBackwardInput) {
        train = std::max(train, Add(held(), recompute));
        --waiting;
        train = std::max(train, Add(held(), input_half));
        ++deferred;
        out.activations = std::max(out.activations, held());
      } else if (op.kind == OpKind::kBackwardWeight) {
        // The next micro-batches' weight halves right after it run with it
        // as one group (Stage::RunOps), their operands gathered.
        int64_t members = 1;
        while (!EndsWeightGroup(members, op.micro_batch + members - 1,
                                grouping.size, per_group, m) &&
               i + 1 < ops.size() &&
               ops[i + 1].kind == OpKind::kBackwardWeight &&
               ops[i + 1].chunk == chunk &&
               ops[i + 1].micro_batch == op.micro_batch + members) {
          ++members;
          ++i;
        }
        const int64_t gathered =
            members > 1 ? Mul(grouping.gathered, members) : 0;
        train = std::max(train, Add(held(), std::max(weight_half, gathered)));
        deferred -= members;
      }
    }
  }
  train = Less(train, out.activations);
  // An evaluation batch goes through whole: the stage's input beside its
  // largest forward.
  const int64_t eval_batch =
      spec.eval().batch_size() > 0 ? spec.eval().batch_size() : batch;
  // An evaluation batch crosses the links whole.
  const int64_t eval_out =
      last ? 0 : Mul(BoundaryBytes(shapes, e, e), eval_batch);
  const int64_t eval_in =
      first ? 0 : Mul(BoundaryBytes(shapes, b, e), eval_batch);
  out.in_flight =
      std::max({last ? 0 : out_bytes, first ? 0 : in_bytes, eval_out, eval_in});
  int64_t eval = Add(LargestOp(shapes, b, e, eval_batch, OpPass::kEvaluation),
                     first ? 0 : Mul(BoundaryBytes(shapes, b, e), eval_batch));
  // The last stage's loss makes no tensor of the logits' size in an
  // evaluation (without a gradient it reads them in place); on a GPU it
  // holds each row's results (12 bytes) and the targets copied to the
  // device (4 bytes a row) beside them.
  if (last)
    eval = Add(eval, Mul(Mul(TargetBytesPerSample(shapes), 4), eval_batch));
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
  // host by the first and the last stage, beside the next step's, gathered
  // ahead (BatchPrefetch).
  const int64_t sample_in = BoundaryBytes(shapes, 0, shapes.inputs.size());
  const int64_t per_sample =
      Add(first ? sample_in : 0, last ? TargetBytesPerSample(shapes) : 0);
  out.batch = Mul(per_sample, Add(batch, std::max(batch, eval_batch)));

  if (first || last) {
    out.data_set = DatasetBytes(spec.data());
    out.data = Add(out.data_set,
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
                            {&w.packed_weights, c.packed_weights},
                            {&w.activations, c.activations},
                            {&w.working, c.working},
                            {&w.in_flight, c.in_flight},
                            {&w.evaluation, c.evaluation},
                            {&w.batch, c.batch}}) {
      *to = Add(*to, from);
    }
    // The worker opens the data set once for all its chunks (ZB-V's worker
    // 0 holds the first and the last stage); each chunk's sampler adds its
    // permutations.
    w.data = Add(w.data, c.data - c.data_set);
    w.data_set = std::max(w.data_set, c.data_set);
  }
  w.data = Add(w.data, w.data_set);
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
    ScheduleKind schedule, RematMode remat, int64_t virtual_stages,
    const std::vector<std::vector<Op>>* worker_ops) {
  std::vector<StageMemory> out;
  const std::vector<PhaseTicks> ticks =
      schedule == ScheduleKind::kZeroBubbleV && worker_ops == nullptr
          ? CostModelTicks(shapes, balance, remat)
          : std::vector<PhaseTicks>();
  const int64_t v =
      Interleaves(schedule) ? std::max<int64_t>(1, virtual_stages) : 1;
  const int64_t workers =
      std::max<int64_t>(1, static_cast<int64_t>(balance.size()) / v);
  const std::vector<std::vector<Op>> built =
      worker_ops != nullptr
          ? std::vector<std::vector<Op>>()
          : MakeWorkerSchedules(schedule, workers, micro_batches, v, ticks);
  const std::vector<std::vector<Op>>& ops =
      worker_ops != nullptr ? *worker_ops : built;
  int64_t begin = 0;
  for (size_t s = 0; s < balance.size(); ++s) {
    StageMemoryPlacement p;
    p.order_ticks = ticks;
    p.worker_ops =
        &ops[WorkerOfStage(schedule, workers, static_cast<int64_t>(s))];
    p.stage = static_cast<int64_t>(s);
    p.stages = static_cast<int64_t>(balance.size());
    p.layer_begin = begin;
    p.layer_end = begin + balance[s];
    p.micro_batches = micro_batches;
    p.schedule = schedule;
    p.virtual_stages = v;
    p.remat = remat;
    out.push_back(EstimateStageMemory(spec, shapes, p));
    begin = p.layer_end;
  }
  return out;
}

}  // namespace gpipe
