#include "services/pipeline/layer_profile.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/core/memory.h"
#include "services/core/rng.h"
#include "services/core/status.h"
#include "services/nn/layer_spec.h"
#include "services/nn/model.h"
#include "services/nn/optimizer.h"

namespace gpipe {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Tensor RandomInput(const gpipe::v1::ModelSpec& model, const Shape& sample,
                   int64_t batch, Rng& rng) {
  const Shape shape = sample.WithBatch(batch);
  if (model.input().dtype() == gpipe::v1::INT32) {
    int64_t vocab = 1;
    if (model.layers_size() > 0 && model.layers(0).has_embedding()) {
      vocab = std::max<int64_t>(1, model.layers(0).embedding().vocab_size());
    }
    std::vector<int32_t> ids(shape.numel());
    for (int32_t& id : ids) id = static_cast<int32_t>(rng.Below(vocab));
    return Tensor::FromInts(shape, ids);
  }
  std::vector<float> values(shape.numel());
  for (float& v : values) v = static_cast<float>(rng.Normal());
  return Tensor::FromVector(shape, values);
}

// A gradient that is neither zero nor large: some kernels take shortcuts on
// zeros, and the timing should be that of a real backward.
Tensor RandomGradient(const Shape& shape, Rng& rng) {
  std::vector<float> values(shape.numel());
  for (float& v : values) v = static_cast<float>(1e-3 * rng.Normal());
  return Tensor::FromVector(shape, values);
}

double Median(std::vector<double> s) {
  if (s.empty()) return 0;
  std::sort(s.begin(), s.end());
  const size_t mid = s.size() / 2;
  return s.size() % 2 == 1 ? s[mid] : 0.5 * (s[mid - 1] + s[mid]);
}

absl::Status CheckSizes(int64_t micro_batch_size, int reps) {
  if (micro_batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "measure: micro-batch size must be >= 1, got ", micro_batch_size));
  }
  if (reps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("measure: reps must be >= 1, got ", reps));
  }
  return absl::OkStatus();
}

// The model's parameters by layer, named as the model names them.
std::vector<std::vector<NamedParameter>> ParametersByLayer(Model& model) {
  std::vector<std::vector<NamedParameter>> out(model.size());
  for (int64_t l = 0; l < model.size(); ++l) {
    for (Parameter* p : model.layer(l).Parameters())
      out[l].push_back({absl::StrCat("layers.", l, ".", p->name), p});
  }
  return out;
}

// The spec's model and what a measurement feeds it: a random micro-batch
// of `micro_batch_size` samples and a random output gradient, drawn from
// the seed mixed with `salt`.
struct Probe {
  ModelShapes shapes;
  std::unique_ptr<Model> model;
  Tensor input, output_grad;
};
absl::StatusOr<Probe> MakeProbe(const gpipe::v1::JobSpec& spec,
                                int64_t micro_batch_size, int reps,
                                uint64_t salt) {
  RETURN_IF_ERROR(CheckSizes(micro_batch_size, reps));
  Probe p;
  ASSIGN_OR_RETURN(p.shapes, InferModelShapes(spec.model()));
  ASSIGN_OR_RETURN(p.model, Model::Build(spec.model(), spec.seed()));
  Rng rng(MixKey({spec.seed(), salt}));
  p.input =
      RandomInput(spec.model(), p.shapes.inputs[0], micro_batch_size, rng);
  p.output_grad = RandomGradient(
      p.shapes.outputs[p.model->size() - 1].WithBatch(micro_batch_size), rng);
  return p;
}

// Untimed runs of `run` until one touches no memory for the first time
// (at most kMaxWarmUps): the heap then has about the layout the timed runs
// reuse, as a training step's has after its first steps.
constexpr int kMaxWarmUps = 8;
template <typename Run>
void WarmUp(Run run) {
  for (int i = 0; i < kMaxWarmUps; ++i) {
    const int64_t before = MinorPageFaults();
    run();
    if (MinorPageFaults() == before) return;
  }
}

// Calls run(r) for r = 1, 2, ... and record(its result) for each kept run
// until `reps` runs were kept, and returns the page faults of the kept
// ones. A run that faults is dropped and made again while there are runs
// to spare (at most 3 x reps in all): glibc's heap, even kept whole, now
// and then places a block on fresh pages, and a first touch is no part of
// a pass. With one warm-up run and every run kept, the CNN example's first
// ReLU found its 1.6 MiB gradient on fresh pages in three of five runs; at
// about 14 us a page fault on this VM its 0.1 ms backward measured 5 ms
// (`plan --measure`).
template <typename Run, typename Record>
int64_t FaultFreeRuns(int reps, Run run, Record record) {
  const int most = 3 * reps;
  int64_t kept_faults = 0;
  for (int r = 1, kept = 0; kept < reps; ++r) {
    const int64_t before = MinorPageFaults();
    auto result = run(r);
    const int64_t faults = MinorPageFaults() - before;
    if (faults > 0 && most - r >= reps - kept) continue;  // made again
    kept_faults += faults;
    record(result);
    ++kept;
  }
  return kept_faults;
}

// A training forward over every layer, keeping each one's record in
// `saved` (size() of them) and adding its seconds to `forward`.
void ForwardAll(Model& model, const Tensor& input, LayerContext ctx,
                std::vector<Saved>& saved, std::vector<double>& forward) {
  Tensor h = input;
  for (int64_t l = 0; l < model.size(); ++l) {
    ctx.layer_index = l;
    const Clock::time_point start = Clock::now();
    h = model.layer(l).Forward(h, ctx, &saved[l]);
    forward[l] += SecondsSince(start);
  }
}

// One training pass over every layer: forward, then backward from
// `output_grad`, adding each layer's seconds to `forward` and `backward`
// (size() each; the same vector for their sum). The first layer computes
// its input gradient only if `first_input_grad`.
void ForwardBackward(Model& model, const Tensor& input,
                     const Tensor& output_grad, LayerContext ctx,
                     bool first_input_grad, std::vector<double>& forward,
                     std::vector<double>& backward) {
  const int64_t n = model.size();
  std::vector<Saved> saved(n);
  ForwardAll(model, input, ctx, saved, forward);
  Tensor g = output_grad;
  for (int64_t l = n - 1; l >= 0; --l) {
    ctx.layer_index = l;
    ctx.input_grad = InputGradUsed(l) || first_input_grad;
    const Clock::time_point start = Clock::now();
    g = model.layer(l).Backward(g, saved[l], ctx);
    backward[l] += SecondsSince(start);
    saved[l].Clear();
  }
}

// One training pass with each layer's backward split in two (input half,
// then at once its weight half), adding each layer's weight-half seconds
// to `weight`.
void ForwardSplitBackward(Model& model, const Tensor& input,
                          const Tensor& output_grad, LayerContext ctx,
                          std::vector<double>& weight) {
  const int64_t n = model.size();
  std::vector<Saved> saved(n);
  std::vector<double> forward(n, 0);  // only the weight halves are wanted
  ForwardAll(model, input, ctx, saved, forward);
  Tensor g = output_grad;
  for (int64_t l = n - 1; l >= 0; --l) {
    ctx.layer_index = l;
    ctx.input_grad = InputGradUsed(l);
    Saved deferred;
    g = model.layer(l).BackwardInput(g, saved[l], ctx, &deferred);
    const Clock::time_point start = Clock::now();
    model.layer(l).BackwardWeight(saved[l], deferred, ctx);
    weight[l] += SecondsSince(start);
    saved[l].Clear();
  }
}

// Each layer's forward and backward medians over `reps` runs after one
// warm-up run (and, with `split`, its weight half's over as many more).
absl::StatusOr<LayerPasses> MeasurePasses(const gpipe::v1::JobSpec& spec,
                                          int64_t micro_batch_size, int reps,
                                          bool first_input_grad, bool split) {
  ASSIGN_OR_RETURN(Probe probe,
                   MakeProbe(spec, micro_batch_size, reps, 0x70726f66ULL));
  Model& model = *probe.model;
  const int64_t n = model.size();

  // [l][r]: layer l's seconds in run r.
  std::vector<std::vector<double>> forward(n), backward(n);
  LayerContext ctx;
  ctx.training = true;
  ctx.seed = spec.seed();
  // One run's seconds by layer: forward and backward, or weight halves.
  using Seconds = std::pair<std::vector<double>, std::vector<double>>;
  const auto run = [&](int r) {
    ctx.step = r;
    Seconds s(std::vector<double>(n, 0), std::vector<double>(n, 0));
    ForwardBackward(model, probe.input, probe.output_grad, ctx,
                    first_input_grad, s.first, s.second);
    model.ZeroGrad();
    return s;
  };
  WarmUp([&] { run(0); });
  LayerPasses out;
  out.timed_page_faults = FaultFreeRuns(reps, run, [&](const Seconds& s) {
    for (int64_t l = 0; l < n; ++l) {
      forward[l].push_back(s.first[l]);
      backward[l].push_back(s.second[l]);
    }
  });
  std::vector<std::vector<double>> weight(n);
  if (split) {
    const auto run_split = [&](int r) {
      ctx.step = reps + 1 + r;
      std::vector<double> w(n, 0);
      ForwardSplitBackward(model, probe.input, probe.output_grad, ctx, w);
      model.ZeroGrad();
      return w;
    };
    WarmUp([&] { run_split(0); });
    out.timed_page_faults +=
        FaultFreeRuns(reps, run_split, [&](const std::vector<double>& w) {
          for (int64_t l = 0; l < n; ++l) weight[l].push_back(w[l]);
        });
  }
  for (int64_t l = 0; l < n; ++l) {
    out.forward.push_back(Median(forward[l]));
    out.backward.push_back(Median(backward[l]));
    out.weight.push_back(Median(weight[l]));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<double>> MeasureLayerSeconds(
    const gpipe::v1::JobSpec& spec, int64_t micro_batch_size, int reps) {
  ASSIGN_OR_RETURN(LayerPasses passes,
                   MeasurePasses(spec, micro_batch_size, reps,
                                 /*first_input_grad=*/true, /*split=*/false));
  std::vector<double> sum(passes.forward.size());
  for (size_t l = 0; l < sum.size(); ++l)
    sum[l] = passes.forward[l] + passes.backward[l];
  return sum;
}

absl::StatusOr<LayerPasses> MeasureLayerPasses(const gpipe::v1::JobSpec& spec,
                                               int64_t micro_batch_size,
                                               int reps) {
  return MeasurePasses(spec, micro_batch_size, reps,
                       /*first_input_grad=*/false, /*split=*/true);
}

absl::StatusOr<LayerStepSeconds> MeasureLayerStepSeconds(
    const gpipe::v1::JobSpec& spec, int64_t micro_batch_size, int reps) {
  ASSIGN_OR_RETURN(Probe probe,
                   MakeProbe(spec, micro_batch_size, reps, 0x73746570ULL));
  Model& model = *probe.model;
  const int64_t n = model.size();
  const std::vector<std::vector<NamedParameter>> params =
      ParametersByLayer(model);
  // One optimizer a layer, so each layer's update is timed alone; the
  // per-parameter arithmetic is the same as one over the whole model.
  std::vector<std::unique_ptr<Optimizer>> optimizers(n);
  for (int64_t l = 0; l < n; ++l) {
    if (params[l].empty()) continue;
    ASSIGN_OR_RETURN(optimizers[l], MakeOptimizer(spec.optimizer(), params[l]));
  }
  const float lr =
      LearningRate(spec.optimizer(), 0, std::max<int64_t>(1, spec.steps()));

  LayerContext ctx;
  ctx.training = true;
  ctx.seed = spec.seed();
  // Per layer and step: the pass after an update, one more with the
  // weights unchanged, the squares and the update.
  std::vector<std::vector<double>> after(n), again(n), norm(n), update(n);
  // Runs r (step 0 warms caches and allocators, WarmUp) and keeps its
  // seconds unless it is the warm-up.
  const auto step = [&](int r) {
    ctx.step = 2 * r;
    std::vector<double> first(n, 0), second(n, 0);
    ForwardBackward(model, probe.input, probe.output_grad, ctx, false, first,
                    first);
    model.ZeroGrad();
    ctx.step = 2 * r + 1;
    ForwardBackward(model, probe.input, probe.output_grad, ctx, false, second,
                    second);
    for (int64_t l = 0; l < n; ++l) {
      if (params[l].empty()) continue;
      Clock::time_point start = Clock::now();
      // A stage sums the squares only when it clips (ClipsGradients).
      const double squares = ClipsGradients(spec.optimizer())
                                 ? AccumulateGradSquares(params[l], 0.0)
                                 : 0.0;
      const double norm_seconds = SecondsSince(start);
      start = Clock::now();
      ScaleGradients(params[l],
                     ClipCoefficient(squares, spec.optimizer().clip_norm()));
      optimizers[l]->Step(lr, r + 1);
      for (const NamedParameter& p : params[l]) p.param->grad.SetZero();
      const double update_seconds = SecondsSince(start);
      if (r == 0) continue;
      after[l].push_back(first[l]);
      again[l].push_back(second[l]);
      norm[l].push_back(norm_seconds);
      update[l].push_back(update_seconds);
    }
  };
  WarmUp([&] { step(0); });
  for (int r = 1; r <= reps; ++r) step(r);

  LayerStepSeconds out;
  out.norm.assign(n, 0);
  out.update.assign(n, 0);
  for (int64_t l = 0; l < n; ++l) {
    if (params[l].empty()) continue;
    out.norm[l] = Median(norm[l]);
    out.update[l] = Median(update[l]);
    // What the first pass after an update does more is re-packing the
    // weights, for the layers that keep a packed copy; elsewhere the
    // difference would be noise of a larger pass.
    if (probe.shapes.costs[l].packed_weight_bytes > 0)
      out.update[l] += std::max(0.0, Median(after[l]) - Median(again[l]));
  }
  return out;
}

}  // namespace gpipe
