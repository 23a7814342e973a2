#include "services/nn/layers/batch_norm.h"

#include "services/nn/init.h"
#include "services/nn/running_statistics.h"
#include "services/tensor/ops.h"

namespace gpipe {

BatchNorm::BatchNorm(const Shape& input, float momentum, float eps)
    : channels_(input[0]),
      inner_(input.rank() == 3 ? input[1] * input[2] : 1),
      momentum_(momentum),
      eps_(eps),
      weight_(MakeParameter("weight", {input[0]}, false)),
      bias_(MakeParameter("bias", {input[0]}, false)) {
  AllocatorScope scope(DefaultCpuAllocator());
  running_mean_ = Tensor::Zeros({channels_});
  running_var_ = Tensor::Filled({channels_}, 1.0f);
}

std::vector<NamedBuffer> BatchNorm::Buffers() {
  return {{"running_mean", &running_mean_}, {"running_var", &running_var_}};
}

void BatchNorm::ApplyRunningStatistics(const float* record) {
  ops::BatchNormMoveRunning(channels_, momentum_, record, running_mean_.f32(),
                            running_var_.f32());
}

void BatchNorm::Initialize(uint64_t) {
  for (int64_t c = 0; c < channels_; ++c) {
    weight_.value.f32()[c] = 1.0f;
    running_mean_.f32()[c] = 0.0f;
    running_var_.f32()[c] = 1.0f;
  }
  bias_.value.SetZero();
}

// The input, the mean and rstd are saved for backward, which normalizes the
// input again; a re-materialized forward does not move the running
// averages a second time.
Tensor BatchNorm::Forward(const Tensor& x, const LayerContext& ctx,
                          Saved* saved) {
  const Device d = x.device();
  Tensor y = Tensor::Empty(x.shape(), DType::kF32, d);
  Tensor mean =
      saved != nullptr ? Tensor::Empty({channels_}, DType::kF32, d) : Tensor();
  Tensor rstd = Tensor::Empty({channels_}, DType::kF32, d);
  const bool moves = ctx.training && !ctx.recompute;
  // Held back (the caller moves the averages at the step's end) on the
  // host; a GPU stage moves them here.
  const bool records =
      moves && ctx.running_statistics != nullptr && d == Device::kCpu;
  Tensor statistics;
  if (records) {
    AllocatorScope scope(DefaultCpuAllocator());
    statistics = Tensor::Empty({2 * channels_});
  }
  ops::BatchNormForward(d, x.dim(0), channels_, inner_, ctx.training,
                        moves && !records, momentum_, eps_, x.f32(),
                        weight_.value.f32(), bias_.value.f32(),
                        running_mean_.f32(), running_var_.f32(), y.f32(),
                        mean.defined() ? mean.f32() : nullptr, rstd.f32(),
                        records ? statistics.f32() : nullptr);
  if (records) {
    ctx.running_statistics->Record(ctx.micro_batch, ctx.layer_index,
                                   std::move(statistics));
  }
  if (saved != nullptr) {
    saved->Put("x", x);
    saved->Put("mean", mean);
    saved->Put("rstd", rstd);
  }
  return y;
}

Tensor BatchNorm::Backward(const Tensor& dy, const Saved& saved,
                           const LayerContext&) {
  const Device d = dy.device();
  Tensor dx = Tensor::Empty(dy.shape(), DType::kF32, d);
  ops::BatchNormBackward(d, dy.dim(0), channels_, inner_, saved.Get("x").f32(),
                         saved.Get("mean").f32(), saved.Get("rstd").f32(),
                         weight_.value.f32(), dy.f32(), dx.f32(),
                         weight_.grad.f32(), bias_.grad.f32());
  return dx;
}

}  // namespace gpipe
