#include "services/nn/layers/activations.h"

#include "services/tensor/ops.h"

namespace gpipe {

// ReLU and Tanh save their output (enough for the gradient); GELU its input.

Tensor ReLU::Forward(const Tensor& x, const LayerContext&, Saved* saved) {
  Tensor y = Tensor::Empty(x.shape(), DType::kF32, x.device());
  ops::ReluForward(x.device(), x.numel(), x.f32(), y.f32());
  if (saved != nullptr) saved->Put("y", y);
  return y;
}

Tensor ReLU::Backward(const Tensor& dy, const Saved& saved,
                      const LayerContext&) {
  Tensor dx = Tensor::Empty(dy.shape(), DType::kF32, dy.device());
  ops::ReluBackward(dy.device(), dy.numel(), saved.Get("y").f32(), dy.f32(),
                    dx.f32());
  return dx;
}

Tensor GELU::Forward(const Tensor& x, const LayerContext&, Saved* saved) {
  Tensor y = Tensor::Empty(x.shape(), DType::kF32, x.device());
  ops::GeluForward(x.device(), x.numel(), x.f32(), y.f32());
  if (saved != nullptr) saved->Put("x", x);
  return y;
}

Tensor GELU::Backward(const Tensor& dy, const Saved& saved,
                      const LayerContext&) {
  Tensor dx = Tensor::Empty(dy.shape(), DType::kF32, dy.device());
  ops::GeluBackward(dy.device(), dy.numel(), saved.Get("x").f32(), dy.f32(),
                    dx.f32());
  return dx;
}

Tensor Tanh::Forward(const Tensor& x, const LayerContext&, Saved* saved) {
  Tensor y = Tensor::Empty(x.shape(), DType::kF32, x.device());
  ops::TanhForward(x.device(), x.numel(), x.f32(), y.f32());
  if (saved != nullptr) saved->Put("y", y);
  return y;
}

Tensor Tanh::Backward(const Tensor& dy, const Saved& saved,
                      const LayerContext&) {
  Tensor dx = Tensor::Empty(dy.shape(), DType::kF32, dy.device());
  ops::TanhBackward(dy.device(), dy.numel(), saved.Get("y").f32(), dy.f32(),
                    dx.f32());
  return dx;
}

}  // namespace gpipe
