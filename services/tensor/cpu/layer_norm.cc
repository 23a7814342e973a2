#include "services/tensor/cpu/layer_norm.h"

#include <cmath>

#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {

// Each row's mean, variance and output are one vectorized pass each over a
// row that stays in L1; the sums over fixed lanes (vector_clones.h), so a
// row's bits depend on the row alone, not on the vector width or threads.
// The variance is the mean squared deviation from the mean (two passes),
// not E[x^2] - E[x]^2, which cancels catastrophically when the mean is large
// against the spread.
GPIPE_VECTOR_CLONES
void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                      const float* gamma, const float* beta, float* y,
                      float* mean, float* rstd) {
#pragma omp parallel for if (rows * cols > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    float* out = y + r * cols;
    const float m = LaneSum(cols, in) / cols;
    const float v = LaneSumSquaredDeviations(cols, in, m) / cols;
    const float s = 1.0f / std::sqrt(v + eps);
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c)
      out[c] = (in[c] - m) * s * gamma[c] + beta[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

GPIPE_VECTOR_CLONES
void LayerNormBackward(int64_t rows, int64_t cols, const float* x,
                       const float* mean, const float* rstd, const float* gamma,
                       const float* dy, float* dx, float* dgamma,
                       float* dbeta) {
#pragma omp parallel for if (rows * cols > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    const float* g = dy + r * cols;
    float* out = dx + r * cols;
    const float m = mean[r], s = rstd[r];
    // With xhat = (x - m) * s and dxhat = dy * gamma:
    // dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
    float lane_d[kLanes] = {}, lane_dx[kLanes] = {};
    int64_t c = 0;
    for (; c + kLanes <= cols; c += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) {
        const float xhat = (in[c + l] - m) * s;
        const float d = g[c + l] * gamma[c + l];
        lane_d[l] += d;
        lane_dx[l] += d * xhat;
      }
    }
    for (int64_t l = 0; c < cols; ++c, ++l) {
      const float xhat = (in[c] - m) * s;
      const float d = g[c] * gamma[c];
      lane_d[l] += d;
      lane_dx[l] += d * xhat;
    }
    const float mean_d = AddLanes(lane_d) / cols;
    const float mean_dx = AddLanes(lane_dx) / cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) {
      const float xhat = (in[j] - m) * s;
      out[j] = s * (g[j] * gamma[j] - mean_d - xhat * mean_dx);
    }
  }
  // Parameter gradients: rows in order for each column, columns vectorized.
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    const float* g = dy + r * cols;
    const float m = mean[r], s = rstd[r];
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      dgamma[c] += g[c] * (in[c] - m) * s;
      dbeta[c] += g[c];
    }
  }
}

}  // namespace gpipe::cpu
