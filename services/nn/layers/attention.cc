#include "services/nn/layers/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "services/tensor/cpu/attention.h"
#include "services/tensor/ops.h"

namespace gpipe {

SelfAttention::SelfAttention(int64_t dim, int64_t heads, bool causal,
                             const std::string& prefix)
    : dim_(dim),
      heads_(heads),
      causal_(causal),
      qkv_(dim, 3 * dim, true, prefix + "qkv."),
      proj_(dim, dim, true, prefix + "proj.") {}

std::vector<Parameter*> SelfAttention::Parameters() {
  std::vector<Parameter*> out = qkv_.Parameters();
  for (Parameter* p : proj_.Parameters()) out.push_back(p);
  return out;
}

void SelfAttention::Initialize(uint64_t key) {
  qkv_.InitializeNormal(MixKey({key, 0}), 0.02f);
  proj_.InitializeNormal(MixKey({key, 1}), 0.02f);
}

Tensor SelfAttention::Decode(const Tensor& x, int64_t position,
                             DecodeState* state) {
  const int64_t batch = x.dim(0), n = x.dim(1), d = dim_, dh = d / heads_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const Device dev = x.device();
  const Tensor fresh = qkv_.Decode(x, position, state);  // [B, n, 3d]
  if (!state->qkv.defined() || state->qkv.dim(0) != batch ||
      state->qkv.device() != dev) {
    state->qkv =
        Tensor::Zeros({batch, state->capacity, 3 * d}, DType::kF32, dev);
  }
  const int64_t cap = state->qkv.dim(1);
  const int64_t end = std::min(position + n, cap);
  const int64_t fit = std::max<int64_t>(end - position, 0);
  // The new rows into the cache: one block of rows per sample.
  const Tensor cache_rows = state->qkv.Reshape({batch * cap, 3 * d});
  const Tensor fresh_rows = fresh.Reshape({batch * n, 3 * d});
  for (int64_t b = 0; b < batch && fit > 0; ++b) {
    cache_rows.Rows(b * cap + position, b * cap + end)
        .CopyFrom(fresh_rows.Rows(b * n, b * n + fit));
  }
  // Rows past the cache (a caller beyond max_positions) stay zero.
  Tensor heads_out = Tensor::Zeros({batch, n, d}, DType::kF32, dev);
  if (fit == n) {
    ops::AttendCachedRows(dev, batch, heads_, cap, position, end, d, scale,
                          state->qkv.f32(), heads_out.f32());
  } else if (fit > 0) {
    Tensor attended = Tensor::Empty({batch, fit, d}, DType::kF32, dev);
    ops::AttendCachedRows(dev, batch, heads_, cap, position, end, d, scale,
                          state->qkv.f32(), attended.f32());
    const Tensor out_rows = heads_out.Reshape({batch * n, d});
    const Tensor from_rows = attended.Reshape({batch * fit, d});
    for (int64_t b = 0; b < batch; ++b) {
      out_rows.Rows(b * n, b * n + fit)
          .CopyFrom(from_rows.Rows(b * fit, (b + 1) * fit));
    }
  }
  return proj_.Decode(heads_out, position, state);
}

// qkv rows are [q | k | v], each `dim` wide; head h uses columns
// [h*dh, (h+1)*dh) of each part. Probabilities P are saved for backward.
Tensor SelfAttention::Forward(const Tensor& x, const LayerContext& ctx,
                              Saved* saved) {
  const int64_t batch = x.dim(0), t = x.dim(1), d = dim_, dh = d / heads_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  Saved qkv_saved;
  Tensor qkv = qkv_.Forward(x, ctx, saved ? &qkv_saved : nullptr);
  const Device dev = x.device();
  Tensor probs = Tensor::Empty({batch, heads_, t, t}, DType::kF32, dev);
  Tensor heads_out = Tensor::Empty({batch, t, d}, DType::kF32, dev);
  ops::AttentionForward(dev, batch, heads_, t, d, causal_, scale, qkv.f32(),
                        probs.f32(), heads_out.f32());
  Saved proj_saved;
  Tensor y = proj_.Forward(heads_out, ctx, saved ? &proj_saved : nullptr);
  if (saved != nullptr) {
    saved->Put("qkv", qkv);
    saved->Put("probs", probs);
    saved->children = {std::move(qkv_saved), std::move(proj_saved)};
  }
  return y;
}

Tensor SelfAttention::Backward(const Tensor& dy, const Saved& saved,
                               const LayerContext& ctx) {
  const Tensor& qkv = saved.Get("qkv");
  const Tensor& probs = saved.Get("probs");
  const int64_t batch = qkv.dim(0), t = qkv.dim(1), d = dim_, dh = d / heads_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  Tensor dout = proj_.Backward(dy, saved.children[1], ctx);
  const Device dev = qkv.device();
  Tensor dqkv = Tensor::Empty(qkv.shape(), DType::kF32, dev);
  ops::AttentionBackward(dev, batch, heads_, t, d, causal_, scale, qkv.f32(),
                         probs.f32(), dout.f32(), dqkv.f32());
  return qkv_.Backward(dqkv, saved.children[0], ctx);
}

// The two projections defer their weight gradients; the attention core has
// no parameters and runs whole in the input half.
Tensor SelfAttention::BackwardInput(const Tensor& dy, Saved& saved,
                                    const LayerContext& ctx, Saved* deferred) {
  const Tensor& qkv = saved.Get("qkv");
  const Tensor& probs = saved.Get("probs");
  const int64_t batch = qkv.dim(0), t = qkv.dim(1), d = dim_, dh = d / heads_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  deferred->children.assign(2, Saved());
  Tensor dout =
      proj_.BackwardInput(dy, saved.children[1], ctx, &deferred->children[1]);
  const Device dev = qkv.device();
  Tensor dqkv = Tensor::Empty(qkv.shape(), DType::kF32, dev);
  ops::AttentionBackward(dev, batch, heads_, t, d, causal_, scale, qkv.f32(),
                         probs.f32(), dout.f32(), dqkv.f32());
  Tensor dx =
      qkv_.BackwardInput(dqkv, saved.children[0], ctx, &deferred->children[0]);
  saved.Drop("qkv");
  saved.Drop("probs");
  return dx;
}

void SelfAttention::BackwardWeight(const Saved& saved, const Saved& deferred,
                                   const LayerContext& ctx) {
  proj_.BackwardWeight(saved.children[1], deferred.children[1], ctx);
  qkv_.BackwardWeight(saved.children[0], deferred.children[0], ctx);
}

}  // namespace gpipe
