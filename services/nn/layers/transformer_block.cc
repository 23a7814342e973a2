#include "services/nn/layers/transformer_block.h"

#include "services/tensor/ops.h"

namespace gpipe {

TransformerBlock::TransformerBlock(int64_t dim, int64_t heads,
                                   int64_t mlp_hidden, float dropout,
                                   bool causal)
    : ln1_(dim, 1e-5f, "ln1."),
      attn_(dim, heads, causal, "attn."),
      drop1_(dropout, 1),
      ln2_(dim, 1e-5f, "ln2."),
      fc1_(dim, mlp_hidden, true, "mlp.fc1."),
      fc2_(mlp_hidden, dim, true, "mlp.fc2."),
      drop2_(dropout, 2) {}

std::vector<Parameter*> TransformerBlock::Parameters() {
  std::vector<Parameter*> out;
  for (Layer* l :
       std::initializer_list<Layer*>{&ln1_, &attn_, &ln2_, &fc1_, &fc2_})
    for (Parameter* p : l->Parameters()) out.push_back(p);
  return out;
}

void TransformerBlock::Initialize(uint64_t key) {
  ln1_.Initialize(MixKey({key, 0}));
  attn_.Initialize(MixKey({key, 1}));
  ln2_.Initialize(MixKey({key, 2}));
  fc1_.InitializeNormal(MixKey({key, 3}), 0.02f);
  fc2_.InitializeNormal(MixKey({key, 4}), 0.02f);
}

Tensor TransformerBlock::Forward(const Tensor& x, const LayerContext& ctx,
                                 Saved* saved) {
  std::vector<Saved> s(5);
  auto slot = [&](int i) { return saved != nullptr ? &s[i] : nullptr; };
  Tensor a = attn_.Forward(ln1_.Forward(x, ctx, slot(0)), ctx, slot(1));
  a = drop1_.Forward(a, ctx, nullptr);
  const Device d = x.device();
  Tensor x1 = Tensor::Empty(x.shape(), DType::kF32, d);
  ops::Add(d, x.numel(), x.f32(), a.f32(), x1.f32());
  Tensor h = fc1_.Forward(ln2_.Forward(x1, ctx, slot(2)), ctx, slot(3));
  Saved gelu_saved;
  h = gelu_.Forward(h, ctx, saved != nullptr ? &gelu_saved : nullptr);
  Tensor m = fc2_.Forward(h, ctx, slot(4));
  m = drop2_.Forward(m, ctx, nullptr);
  Tensor y = Tensor::Empty(x.shape(), DType::kF32, d);
  ops::Add(d, x.numel(), x1.f32(), m.f32(), y.f32());
  if (saved != nullptr) {
    s.push_back(std::move(gelu_saved));
    saved->children = std::move(s);
  }
  return y;
}

// Forward's arithmetic without dropout (evaluation), attention decoding.
Tensor TransformerBlock::Decode(const Tensor& x, int64_t position,
                                DecodeState* state) {
  LayerContext ctx;
  ctx.training = false;
  const Tensor a = attn_.Decode(ln1_.Forward(x, ctx, nullptr), position, state);
  const Device d = x.device();
  Tensor x1 = Tensor::Empty(x.shape(), DType::kF32, d);
  ops::Add(d, x.numel(), x.f32(), a.f32(), x1.f32());
  Tensor h = fc1_.Decode(ln2_.Forward(x1, ctx, nullptr), position, state);
  h = gelu_.Forward(h, ctx, nullptr);
  const Tensor m = fc2_.Decode(h, position, state);
  Tensor y = Tensor::Empty(x.shape(), DType::kF32, d);
  ops::Add(d, x.numel(), x1.f32(), m.f32(), y.f32());
  return y;
}

Tensor TransformerBlock::Backward(const Tensor& dy, const Saved& saved,
                                  const LayerContext& ctx) {
  const std::vector<Saved>& s = saved.children;
  Tensor dm = drop2_.Backward(dy, Saved(), ctx);
  Tensor dh = fc2_.Backward(dm, s[4], ctx);
  dh = gelu_.Backward(dh, s[5], ctx);
  Tensor dx1 = ln2_.Backward(fc1_.Backward(dh, s[3], ctx), s[2], ctx);
  ops::AddInPlace(dy.device(), dy.numel(), dy.f32(), dx1.f32());
  Tensor da = drop1_.Backward(dx1, Saved(), ctx);
  Tensor dx = ln1_.Backward(attn_.Backward(da, s[1], ctx), s[0], ctx);
  ops::AddInPlace(dx.device(), dx1.numel(), dx1.f32(), dx.f32());
  return dx;
}

// Backward's arithmetic with the three GEMM layers' weight halves deferred
// (deferred->children: fc2, fc1, attention); the layer norms are cheap and
// their parameter gradients come out of their input gradient's pass. The
// in-place adds below write to gradients that no deferred record holds.
Tensor TransformerBlock::BackwardInput(const Tensor& dy, Saved& saved,
                                       const LayerContext& ctx,
                                       Saved* deferred) {
  std::vector<Saved>& s = saved.children;
  std::vector<Saved>& w = deferred->children;
  w.assign(3, Saved());
  Tensor dm = drop2_.Backward(dy, Saved(), ctx);
  Tensor dh = fc2_.BackwardInput(dm, s[4], ctx, &w[0]);
  dh = gelu_.Backward(dh, s[5], ctx);
  Tensor dx1 =
      ln2_.Backward(fc1_.BackwardInput(dh, s[3], ctx, &w[1]), s[2], ctx);
  ops::AddInPlace(dy.device(), dy.numel(), dy.f32(), dx1.f32());
  Tensor da = drop1_.Backward(dx1, Saved(), ctx);
  Tensor dx =
      ln1_.Backward(attn_.BackwardInput(da, s[1], ctx, &w[2]), s[0], ctx);
  ops::AddInPlace(dx.device(), dx1.numel(), dx1.f32(), dx.f32());
  // The weight half reads the GEMM layers' records only.
  for (int i : {0, 2, 5}) s[i].Clear();
  return dx;
}

void TransformerBlock::BackwardWeight(const Saved& saved, const Saved& deferred,
                                      const LayerContext& ctx) {
  const std::vector<Saved>& s = saved.children;
  const std::vector<Saved>& w = deferred.children;
  fc2_.BackwardWeight(s[4], w[0], ctx);
  fc1_.BackwardWeight(s[3], w[1], ctx);
  attn_.BackwardWeight(s[1], w[2], ctx);
}

}  // namespace gpipe
