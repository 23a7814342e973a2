#include "services/pipeline/layer_profile.h"

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/core/rng.h"
#include "services/core/status.h"
#include "services/nn/layer_spec.h"
#include "services/nn/model.h"

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

}  // namespace

absl::StatusOr<std::vector<double>> MeasureLayerSeconds(
    const gpipe::v1::JobSpec& spec, int64_t micro_batch_size, int reps) {
  if (micro_batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "measure: micro-batch size must be >= 1, got ", micro_batch_size));
  }
  if (reps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("measure: reps must be >= 1, got ", reps));
  }
  ASSIGN_OR_RETURN(ModelShapes shapes, InferModelShapes(spec.model()));
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   Model::Build(spec.model(), spec.seed()));
  const int64_t n = model->size();
  Rng rng(MixKey({spec.seed(), 0x70726f66ULL}));
  const Tensor input =
      RandomInput(spec.model(), shapes.inputs[0], micro_batch_size, rng);
  const Tensor output_grad =
      RandomGradient(shapes.outputs[n - 1].WithBatch(micro_batch_size), rng);

  // samples[l][r]: layer l's forward + backward seconds in run r.
  std::vector<std::vector<double>> samples(n);
  LayerContext ctx;
  ctx.training = true;
  ctx.seed = spec.seed();
  std::vector<Saved> saved(n);
  for (int r = 0; r <= reps; ++r) {  // run 0 warms caches and allocators
    ctx.step = r;
    std::vector<double> seconds(n, 0);
    Tensor h = input;
    for (int64_t l = 0; l < n; ++l) {
      ctx.layer_index = l;
      saved[l].Clear();
      const Clock::time_point start = Clock::now();
      h = model->layer(l).Forward(h, ctx, &saved[l]);
      seconds[l] += SecondsSince(start);
    }
    Tensor g = output_grad;
    for (int64_t l = n - 1; l >= 0; --l) {
      ctx.layer_index = l;
      const Clock::time_point start = Clock::now();
      g = model->layer(l).Backward(g, saved[l], ctx);
      seconds[l] += SecondsSince(start);
      saved[l].Clear();
    }
    model->ZeroGrad();
    if (r == 0) continue;
    for (int64_t l = 0; l < n; ++l) samples[l].push_back(seconds[l]);
  }

  std::vector<double> median(n);
  for (int64_t l = 0; l < n; ++l) {
    std::vector<double>& s = samples[l];
    std::sort(s.begin(), s.end());
    const size_t mid = s.size() / 2;
    median[l] = s.size() % 2 == 1 ? s[mid] : 0.5 * (s[mid - 1] + s[mid]);
  }
  return median;
}

}  // namespace gpipe
