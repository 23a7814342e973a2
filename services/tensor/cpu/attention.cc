#include "services/tensor/cpu/attention.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace gpipe::cpu {

void AttendRow(const float* qi, const float* k, const float* v, int64_t last,
               int64_t stride, int64_t dh, float scale, float* pi, float* oi) {
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

void AttentionForward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                      bool causal, float scale, const float* qkv, float* probs,
                      float* out) {
  const int64_t d = dim, dh = dim / heads;
  std::memset(probs, 0, sizeof(float) * batch * heads * t * t);
  std::memset(out, 0, sizeof(float) * batch * t * d);
#pragma omp parallel for collapse(2) if (batch * heads * t * t * dh > (1 << 16))
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = qkv + b * t * 3 * d + h * dh;
      const float* k = q + d;
      const float* v = q + 2 * d;
      float* p = probs + (b * heads + h) * t * t;
      float* o = out + b * t * d + h * dh;
      for (int64_t i = 0; i < t; ++i) {
        AttendRow(q + i * 3 * d, k, v, causal ? i : t - 1, 3 * d, dh, scale,
                  p + i * t, o + i * d);
      }
    }
  }
}

void AttentionBackward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                       bool causal, float scale, const float* qkv,
                       const float* probs, const float* dout, float* dqkv) {
  const int64_t d = dim, dh = dim / heads;
  std::memset(dqkv, 0, sizeof(float) * batch * t * 3 * d);
#pragma omp parallel for collapse(2) if (batch * heads * t * t * dh > (1 << 16))
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t off = b * t * 3 * d + h * dh;
      const float* q = qkv + off;
      const float* k = q + d;
      const float* v = q + 2 * d;
      float* dq = dqkv + off;
      float* dk = dq + d;
      float* dv = dq + 2 * d;
      const float* p = probs + (b * heads + h) * t * t;
      const float* go = dout + b * t * d + h * dh;
      std::vector<float> dp(t);
      for (int64_t i = 0; i < t; ++i) {
        const int64_t last = causal ? i : t - 1;
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
}

void AttendCachedRows(int64_t batch, int64_t heads, int64_t cap, int64_t from,
                      int64_t to, int64_t dim, float scale, const float* qkv,
                      float* out) {
  const int64_t n = to - from, d = dim, dh = dim / heads;
  std::memset(out, 0, sizeof(float) * batch * n * d);
  std::vector<float> p(static_cast<size_t>(to));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* base = qkv + b * cap * 3 * d + h * dh;
      for (int64_t i = from; i < to; ++i) {
        AttendRow(base + i * 3 * d, base + d, base + 2 * d, i, 3 * d, dh, scale,
                  p.data(), out + (b * n + i - from) * d + h * dh);
      }
    }
  }
}

}  // namespace gpipe::cpu
