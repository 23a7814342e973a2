#include "services/nn/layers/linear.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "services/nn/init.h"
#include "services/tensor/cpu/gemm.h"
#include "services/tensor/ops.h"

namespace gpipe {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias,
               const std::string& prefix)
    : in_(in_features),
      out_(out_features),
      has_bias_(bias),
      weight_(
          MakeParameter(prefix + "weight", {out_features, in_features}, true)) {
  weight_.first_gradient_overwrites = true;  // WeightGrad's one product
  if (has_bias_) bias_ = MakeParameter(prefix + "bias", {out_features}, false);
}

std::vector<Parameter*> Linear::Parameters() {
  if (has_bias_) return {&weight_, &bias_};
  return {&weight_};
}

void Linear::Initialize(uint64_t key) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(in_));
  InitUniform(weight_.value, MixKey({key, 0}), bound);
  if (has_bias_) InitUniform(bias_.value, MixKey({key, 1}), bound);
}

void Linear::InitializeNormal(uint64_t key, float stddev) {
  InitNormal(weight_.value, MixKey({key, 0}), stddev);
  if (has_bias_) bias_.value.SetZero();
}

Tensor Linear::Forward(const Tensor& x, const LayerContext& ctx, Saved* saved) {
  const int64_t rows = x.numel() / in_;
  std::vector<int64_t> dims = x.shape().dims();
  dims.back() = out_;
  const Device d = x.device();
  Tensor y = Tensor::Empty(Shape(dims), DType::kF32, d);
  Affine(rows, x.f32(), y.f32());
  if (saved != nullptr) saved->Put("x", x);
  return y;
}

Tensor Linear::Decode(const Tensor& x, int64_t, DecodeState*) {
  const int64_t rows = x.numel() / in_;
  std::vector<int64_t> dims = x.shape().dims();
  dims.back() = out_;
  const Device d = x.device();
  Tensor y = Tensor::Empty(Shape(dims), DType::kF32, d);
  // On the CPU every product gives each row of C from its row of A alone
  // (cpu::GemmRowStable), the packed one too.
  if (d == Device::kCpu) {
    Affine(rows, x.f32(), y.f32());
    return y;
  }
  ops::GemmRowStable(d, rows, out_, in_, x.f32(),
                     std::as_const(weight_.value).f32(), y.f32());
  if (has_bias_) ops::AddRowBias(d, rows, out_, bias_.value.f32(), y.f32());
  return y;
}

void Linear::Affine(int64_t rows, const float* x, float* y) const {
  const Tensor& w = weight_.value;
  if (w.device() == Device::kCpu) {
    forward_pack_.Multiply(true, rows, out_, in_, x, w, y,
                           has_bias_ ? bias_.value.f32() : nullptr);
    return;
  }
  Product(true, rows, out_, in_, x, y);
  if (has_bias_) ops::AddRowBias(w.device(), rows, out_, bias_.value.f32(), y);
}

void Linear::Product(bool trans, int64_t rows, int64_t n, int64_t k,
                     const float* a, float* c) const {
  // Read through const: a non-const access would count as a write and
  // pack the weight again for every product.
  const Tensor& w = weight_.value;
  PackedWeight& pack = trans ? forward_pack_ : input_grad_pack_;
  if (w.device() == Device::kCpu) {
    pack.Multiply(trans, rows, n, k, a, w, c);
    return;
  }
  pack.Clear();  // moved off the CPU: the copy would only hold memory
  ops::Gemm(w.device(), false, trans, rows, n, k, 1.0f, a, w.f32(), 0.0f, c);
}

void Linear::PackWeights(bool input_grad) {
  // Read through const, as Product does: a non-const access counts as a
  // write.
  const Tensor& w = weight_.value;
  if (w.device() != Device::kCpu) return;
  forward_pack_.Prepare(true, out_, in_, w);
  if (input_grad) input_grad_pack_.Prepare(false, in_, out_, w);
}

void Linear::WeightGrad(const Tensor& x, const Tensor& dy) {
  const int64_t rows = x.numel() / in_;
  const Device d = x.device();
  // The step's first product onto an unwritten gradient starts its chains
  // from +0 (beta = 0) where the others continue them: on the CPU the same
  // bits as starting from zeros in memory (Parameter::grad_unwritten).
  float beta = 1.0f;
  if (weight_.grad_unwritten) {
    if (d == Device::kCpu)
      beta = 0.0f;
    else
      weight_.grad.SetZero();
    weight_.grad_unwritten = false;
  }
  ops::Gemm(d, true, false, out_, in_, rows, 1.0f, dy.f32(), x.f32(), beta,
            weight_.grad.f32());
  if (has_bias_) ops::SumRowsInto(d, rows, out_, dy.f32(), bias_.grad.f32());
}

Tensor Linear::InputGrad(const Tensor& x, const Tensor& dy) const {
  const int64_t rows = x.numel() / in_;
  const Device d = x.device();
  Tensor dx = Tensor::Empty(x.shape(), DType::kF32, d);
  Product(false, rows, in_, out_, dy.f32(), dx.f32());
  return dx;
}

Tensor Linear::Backward(const Tensor& dy, const Saved& saved,
                        const LayerContext& ctx) {
  const Tensor& x = saved.Get("x");
  WeightGrad(x, dy);
  return ctx.input_grad ? InputGrad(x, dy) : Tensor();
}

Tensor Linear::BackwardInput(const Tensor& dy, Saved& saved,
                             const LayerContext& ctx, Saved* deferred) {
  deferred->Put("dy", dy);
  return ctx.input_grad ? InputGrad(saved.Get("x"), dy) : Tensor();
}

void Linear::BackwardWeight(const Saved& saved, const Saved& deferred,
                            const LayerContext&) {
  WeightGrad(saved.Get("x"), deferred.Get("dy"));
}

WeightGroupCost Linear::GroupCost(const Saved& saved) const {
  const int64_t rows = saved.Get("x").numel() / in_;
  WeightGroupCost c;
  c.rows = rows;
  c.held_bytes = rows * (in_ + out_) * 4;
  c.gradient_bytes =
      weight_.value.nbytes() + (has_bias_ ? bias_.value.nbytes() : 0);
  return c;
}

void Linear::BackwardWeights(std::span<const WeightHalf> halves) {
  if (halves.size() < 2 || !GroupsWeightHalves()) {
    Layer::BackwardWeights(halves);
    return;
  }
  int64_t rows = 0;
  for (const WeightHalf& h : halves) rows += h.saved->Get("x").numel() / in_;
  Tensor x = Tensor::Empty(Shape({rows, in_}), DType::kF32, Device::kCpu);
  Tensor dy = Tensor::Empty(Shape({rows, out_}), DType::kF32, Device::kCpu);
  float* xs = x.f32();
  float* dys = dy.f32();
  for (const WeightHalf& h : halves) {
    const Tensor& hx = h.saved->Get("x");
    const Tensor& hdy = h.deferred->Get("dy");
    std::copy_n(hx.f32(), hx.numel(), xs);
    std::copy_n(hdy.f32(), hdy.numel(), dys);
    xs += hx.numel();
    dys += hdy.numel();
  }
  WeightGrad(x, dy);
}

}  // namespace gpipe
