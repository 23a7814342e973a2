#include "services/nn/layers/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

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

void SelfAttention::AttendRow(const float* qi, const float* k, const float* v,
                              int64_t last, int64_t stride, int64_t dh,
                              float scale, float* pi, float* oi) {
  float m = -INFINITY;
  for (int64_t j = 0; j <= last; ++j) {
    float s = 0.0f;
    for (int64_t c = 0; c < dh; ++c) s += qi[c] * k[j * stride + c];
    pi[j] = s * scale;
    m = pi[j] > m ? pi[j] : m;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j <= last; ++j) {
    pi[j] = std::exp(pi[j] - m);
    sum += pi[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j <= last; ++j) {
    pi[j] *= inv;
    const float* vj = v + j * stride;
    for (int64_t c = 0; c < dh; ++c) oi[c] += pi[j] * vj[c];
  }
}

Tensor SelfAttention::Decode(const Tensor& x, int64_t position,
                             DecodeState* state) {
  const int64_t batch = x.dim(0), n = x.dim(1), d = dim_, dh = d / heads_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  const Tensor fresh = qkv_.Decode(x, position, state);  // [B, n, 3d]
  if (!state->qkv.defined() || state->qkv.dim(0) != batch) {
    state->qkv = Tensor::Zeros({batch, state->capacity, 3 * d});
  }
  const int64_t cap = state->qkv.dim(1);
  const int64_t end = std::min(position + n, cap);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = position; i < end; ++i) {
      std::copy_n(fresh.f32() + (b * n + i - position) * 3 * d, 3 * d,
                  state->qkv.f32() + (b * cap + i) * 3 * d);
    }
  }
  Tensor heads_out = Tensor::Zeros({batch, n, d});
  std::vector<float> p(static_cast<size_t>(end));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads_; ++h) {
      const float* base = state->qkv.f32() + b * cap * 3 * d + h * dh;
      for (int64_t i = position; i < end; ++i) {
        AttendRow(base + i * 3 * d, base + d, base + 2 * d, i, 3 * d, dh, scale,
                  p.data(),
                  heads_out.f32() + (b * n + i - position) * d + h * dh);
      }
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
  // The GPU writes both whole; the CPU loops add into zeros and leave the
  // masked probabilities at zero.
  Tensor probs, heads_out;
  if (dev == Device::kCuda) {
    probs = Tensor::Empty({batch, heads_, t, t}, DType::kF32, dev);
    heads_out = Tensor::Empty({batch, t, d}, DType::kF32, dev);
    ops::CudaAttentionForward(batch, heads_, t, d, causal_, scale, qkv.f32(),
                              probs.f32(), heads_out.f32());
  } else {
    probs = Tensor::Zeros({batch, heads_, t, t});
    heads_out = Tensor::Zeros({batch, t, d});
  }
  const float* base = qkv.f32();
  if (dev == Device::kCpu) {
#pragma omp parallel for collapse(2) if (batch * heads_ * t * t * dh > \
                                         (1 << 16))
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t h = 0; h < heads_; ++h) {
        const float* q = base + b * t * 3 * d + h * dh;
        const float* k = q + d;
        const float* v = q + 2 * d;
        float* p = probs.f32() + (b * heads_ + h) * t * t;
        float* o = heads_out.f32() + b * t * d + h * dh;
        for (int64_t i = 0; i < t; ++i) {
          AttendRow(q + i * 3 * d, k, v, causal_ ? i : t - 1, 3 * d, dh, scale,
                    p + i * t, o + i * d);
        }
      }
    }
  }
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
  if (dev == Device::kCuda) {
    Tensor dqkv = Tensor::Empty(qkv.shape(), DType::kF32, dev);
    ops::CudaAttentionBackward(batch, heads_, t, d, causal_, scale, qkv.f32(),
                               probs.f32(), dout.f32(), dqkv.f32());
    return qkv_.Backward(dqkv, saved.children[0], ctx);
  }
  Tensor dqkv = Tensor::Zeros(qkv.shape());
#pragma omp parallel for collapse(2) if (batch * heads_ * t * t * dh > \
                                         (1 << 16))
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads_; ++h) {
      const int64_t off = b * t * 3 * d + h * dh;
      const float* q = qkv.f32() + off;
      const float* k = q + d;
      const float* v = q + 2 * d;
      float* dq = dqkv.f32() + off;
      float* dk = dq + d;
      float* dv = dq + 2 * d;
      const float* p = probs.f32() + (b * heads_ + h) * t * t;
      const float* go = dout.f32() + b * t * d + h * dh;
      std::vector<float> dp(t);
      for (int64_t i = 0; i < t; ++i) {
        const int64_t last = causal_ ? i : t - 1;
        const float* pi = p + i * t;
        const float* goi = go + i * d;
        float dot = 0.0f;
        for (int64_t j = 0; j <= last; ++j) {
          const float* vj = v + j * 3 * d;
          float s = 0.0f;
          for (int64_t c = 0; c < dh; ++c) s += goi[c] * vj[c];
          dp[j] = s;
          dot += s * pi[j];
          float* dvj = dv + j * 3 * d;
          for (int64_t c = 0; c < dh; ++c) dvj[c] += pi[j] * goi[c];
        }
        float* dqi = dq + i * 3 * d;
        const float* qi = q + i * 3 * d;
        for (int64_t j = 0; j <= last; ++j) {
          const float ds = pi[j] * (dp[j] - dot) * scale;
          const float* kj = k + j * 3 * d;
          float* dkj = dk + j * 3 * d;
          for (int64_t c = 0; c < dh; ++c) {
            dqi[c] += ds * kj[c];
            dkj[c] += ds * qi[c];
          }
        }
      }
    }
  }
  return qkv_.Backward(dqkv, saved.children[0], ctx);
}

}  // namespace gpipe
