#include "services/nn/layers/dropout.h"

#include "services/tensor/ops.h"

namespace gpipe {

Tensor Dropout::Forward(const Tensor& x, const LayerContext& ctx, Saved*) {
  if (!ctx.training || p_ == 0.0f) return x;
  Tensor y = Tensor::Empty(x.shape(), DType::kF32, x.device());
  ops::DropoutForward(x.device(), x.numel(), p_, ctx.DropoutKey(sub_), x.f32(),
                      y.f32());
  return y;
}

Tensor Dropout::Backward(const Tensor& dy, const Saved&,
                         const LayerContext& ctx) {
  if (p_ == 0.0f) return dy;
  Tensor dx = Tensor::Empty(dy.shape(), DType::kF32, dy.device());
  ops::DropoutBackward(dy.device(), dy.numel(), p_, ctx.DropoutKey(sub_),
                       dy.f32(), dx.f32());
  return dx;
}

}  // namespace gpipe
