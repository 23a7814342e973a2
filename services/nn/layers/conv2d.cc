#include "services/nn/layers/conv2d.h"

#include <cmath>

#include "services/nn/init.h"
#include "services/tensor/ops.h"

namespace gpipe {

Conv2d::Conv2d(const Shape& input, int64_t out_channels, int64_t kernel,
               int64_t stride, int64_t padding, bool bias)
    : geometry_{input[0], input[1], input[2], kernel, stride, padding},
      out_channels_(out_channels),
      has_bias_(bias),
      weight_(MakeParameter("weight", {out_channels, input[0], kernel, kernel},
                            true)) {
  if (has_bias_) bias_ = MakeParameter("bias", {out_channels}, false);
}

std::vector<Parameter*> Conv2d::Parameters() {
  if (has_bias_) return {&weight_, &bias_};
  return {&weight_};
}

void Conv2d::Initialize(uint64_t key) {
  const int64_t fan_in =
      geometry_.channels * geometry_.kernel * geometry_.kernel;
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  InitUniform(weight_.value, MixKey({key, 0}), bound);
  if (has_bias_) InitUniform(bias_.value, MixKey({key, 1}), bound);
}

Tensor Conv2d::Forward(const Tensor& x, const LayerContext&, Saved* saved) {
  const cpu::ConvGeometry& g = geometry_;
  const int64_t batch = x.dim(0);
  const Device d = x.device();
  Tensor y = Tensor::Empty(
      {batch, out_channels_, g.out_height(), g.out_width()}, DType::kF32, d);
  ops::Conv2dForward(d, g, batch, out_channels_, x.f32(), weight_.value.f32(),
                     has_bias_ ? bias_.value.f32() : nullptr, y.f32());
  if (saved != nullptr) saved->Put("x", x);
  return y;
}

Tensor Conv2d::Backward(const Tensor& dy, const Saved& saved,
                        const LayerContext& ctx) {
  return Gradients(saved.Get("x"), dy, ctx.input_grad, /*weight=*/true);
}

Tensor Conv2d::BackwardInput(const Tensor& dy, Saved& saved,
                             const LayerContext& ctx, Saved* deferred) {
  deferred->Put("dy", dy);
  return Gradients(saved.Get("x"), dy, ctx.input_grad, /*weight=*/false);
}

void Conv2d::BackwardWeight(const Saved& saved, const Saved& deferred,
                            const LayerContext&) {
  Gradients(saved.Get("x"), deferred.Get("dy"), /*input=*/false,
            /*weight=*/true);
}

// Conv2dBackward skips what it is given no output for: the input gradient's
// GEMM and col2im, or the weight gradient's im2col and GEMM (and the bias's
// sums), so each half costs only its own products.
Tensor Conv2d::Gradients(const Tensor& x, const Tensor& dy, bool input,
                         bool weight) {
  if (!input && !weight) return Tensor();
  const Device d = x.device();
  Tensor dx;
  if (input) dx = Tensor::Empty(x.shape(), DType::kF32, d);
  ops::Conv2dBackward(d, geometry_, x.dim(0), out_channels_, x.f32(),
                      weight_.value.f32(), dy.f32(), input ? dx.f32() : nullptr,
                      weight ? weight_.grad.f32() : nullptr,
                      weight && has_bias_ ? bias_.grad.f32() : nullptr);
  return dx;
}

}  // namespace gpipe
