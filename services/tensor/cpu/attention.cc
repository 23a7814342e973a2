#include "services/tensor/cpu/attention.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "services/tensor/cpu/gemm.h"
#include "services/tensor/cpu/softmax_row.h"
#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {

namespace {

// A row of t scaled scores (keys past `last` ignored)
// becomes its softmax, zero past `last`.
[[gnu::always_inline]] inline void MaskedSoftmaxRow(float* s, int64_t t,
                                                    int64_t last) {
  SoftmaxRow(last + 1, s, s);
  for (int64_t j = last + 1; j < t; ++j) s[j] = 0.0f;
}

// The triangle a causal block's product may skip; none without the mask.
GemmTriangle Lower(bool causal, GemmTriangle triangle) {
  return causal ? triangle : GemmTriangle::kFull;
}

}  // namespace

GPIPE_VECTOR_CLONES
void AttendRow(const float* qi, const float* k, const float* v, int64_t last,
               int64_t stride, int64_t dh, float scale, float* pi, float* oi) {
  for (int64_t j = 0; j <= last; ++j) {
    float s = 0.0f;
    for (int64_t c = 0; c < dh; ++c) s += qi[c] * k[j * stride + c];
    pi[j] = s * scale;
  }
  MaskedSoftmaxRow(pi, last + 1, last);
  for (int64_t j = 0; j <= last; ++j) {
    const float* vj = v + j * stride;
    for (int64_t c = 0; c < dh; ++c) oi[c] += pi[j] * vj[c];
  }
}

// Per (sample, head): S = scale Q K^T and O = P V as GEMMs over the strided
// q, k, v columns of the qkv rows (cpu::GemmTriangular, GemmStrided's
// blocking: its panels depend on the shape only, so the bits do not depend
// on the thread count, nor on whether it runs nested in the loop over
// heads). A causal block skips the
// masked half where whole register tiles fall in it: the scores above the
// diagonal, and the products with P's zeros (GemmTriangle: the same bits).
GPIPE_VECTOR_CLONES
void AttentionForward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                      bool causal, float scale, const float* qkv, float* probs,
                      float* out) {
  const int64_t d = dim, dh = dim / heads;
#pragma omp parallel for collapse(2) schedule(static) if (batch * heads > 1)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = qkv + b * t * 3 * d + h * dh;
      const float* k = q + d;
      const float* v = q + 2 * d;
      float* p = probs + (b * heads + h) * t * t;
      GemmTriangular(Lower(causal, GemmTriangle::kLowerOutput), false, true, t,
                     t, dh, scale, q, 3 * d, k, 3 * d, p, t);
      for (int64_t i = 0; i < t; ++i)
        MaskedSoftmaxRow(p + i * t, t, causal ? i : t - 1);
      GemmTriangular(Lower(causal, GemmTriangle::kLowerA), false, false, t, dh,
                     t, 1.0f, p, t, v, 3 * d, out + b * t * d + h * dh, d);
    }
  }
}

// dV = P^T dO, dP = dO V^T, dS = P (dP - rowsum(dP P)) scale, dQ = dS K,
// dK = dS^T Q, each product a GEMM as in the forward.
GPIPE_VECTOR_CLONES
void AttentionBackward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                       bool causal, float scale, const float* qkv,
                       const float* probs, const float* dout, float* dqkv) {
  const int64_t d = dim, dh = dim / heads;
#pragma omp parallel for collapse(2) schedule(static) if (batch * heads > 1)
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
      std::vector<float> ds(static_cast<size_t>(t * t));
      GemmTriangular(Lower(causal, GemmTriangle::kUpperA), true, false, t, dh,
                     t, 1.0f, p, t, go, d, dv, 3 * d);
      GemmTriangular(Lower(causal, GemmTriangle::kLowerOutput), false, true, t,
                     t, dh, 1.0f, go, d, v, 3 * d, ds.data(), t);
      for (int64_t i = 0; i < t; ++i) {
        const int64_t last = causal ? i : t - 1;
        float* dsi = ds.data() + i * t;
        SoftmaxRowBackward(last + 1, p + i * t, dsi, scale, dsi);
        for (int64_t j = last + 1; j < t; ++j) dsi[j] = 0.0f;
      }
      GemmTriangular(Lower(causal, GemmTriangle::kLowerA), false, false, t, dh,
                     t, 1.0f, ds.data(), t, k, 3 * d, dq, 3 * d);
      GemmTriangular(Lower(causal, GemmTriangle::kUpperA), true, false, t, dh,
                     t, 1.0f, ds.data(), t, q, 3 * d, dk, 3 * d);
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
