#include "services/nn/layers/layer_norm.h"

#include "services/nn/init.h"
#include "services/tensor/ops.h"

namespace gpipe {

LayerNorm::LayerNorm(int64_t features, float eps, const std::string& prefix)
    : features_(features),
      eps_(eps),
      weight_(MakeParameter(prefix + "weight", {features}, false)),
      bias_(MakeParameter(prefix + "bias", {features}, false)) {}

void LayerNorm::Initialize(uint64_t) {
  float* w = weight_.value.f32();
  for (int64_t i = 0; i < features_; ++i) w[i] = 1.0f;
  bias_.value.SetZero();
}

Tensor LayerNorm::Forward(const Tensor& x, const LayerContext&, Saved* saved) {
  const int64_t rows = x.numel() / features_;
  const Device d = x.device();
  Tensor y = Tensor::Empty(x.shape(), DType::kF32, d);
  Tensor mean = Tensor::Empty({rows}, DType::kF32, d);
  Tensor rstd = Tensor::Empty({rows}, DType::kF32, d);
  ops::LayerNormForward(d, rows, features_, eps_, x.f32(), weight_.value.f32(),
                        bias_.value.f32(), y.f32(), mean.f32(), rstd.f32());
  if (saved != nullptr) {
    saved->Put("x", x);
    saved->Put("mean", mean);
    saved->Put("rstd", rstd);
  }
  return y;
}

Tensor LayerNorm::Backward(const Tensor& dy, const Saved& saved,
                           const LayerContext&) {
  const Tensor& x = saved.Get("x");
  const int64_t rows = x.numel() / features_;
  Tensor dx = Tensor::Empty(x.shape(), DType::kF32, x.device());
  ops::LayerNormBackward(x.device(), rows, features_, x.f32(),
                         saved.Get("mean").f32(), saved.Get("rstd").f32(),
                         weight_.value.f32(), dy.f32(), dx.f32(),
                         weight_.grad.f32(), bias_.grad.f32());
  return dx;
}

}  // namespace gpipe
