#include "services/tensor/cpu/layer_norm.h"

#include <cmath>

namespace gpipe::cpu {

void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                      const float* gamma, const float* beta, float* y,
                      float* mean, float* rstd) {
#pragma omp parallel for if (rows * cols > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    float* out = y + r * cols;
    float m = 0.0f;
    for (int64_t c = 0; c < cols; ++c) m += in[c];
    m /= cols;
    float v = 0.0f;
    for (int64_t c = 0; c < cols; ++c) v += (in[c] - m) * (in[c] - m);
    v /= cols;
    const float s = 1.0f / std::sqrt(v + eps);
    for (int64_t c = 0; c < cols; ++c)
      out[c] = (in[c] - m) * s * gamma[c] + beta[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

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
    float sum_d = 0.0f, sum_dx = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      const float xhat = (in[c] - m) * s;
      const float d = g[c] * gamma[c];
      sum_d += d;
      sum_dx += d * xhat;
    }
    sum_d /= cols;
    sum_dx /= cols;
    for (int64_t c = 0; c < cols; ++c) {
      const float xhat = (in[c] - m) * s;
      out[c] = s * (g[c] * gamma[c] - sum_d - xhat * sum_dx);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* in = x + r * cols;
    const float* g = dy + r * cols;
    const float m = mean[r], s = rstd[r];
    for (int64_t c = 0; c < cols; ++c) {
      dgamma[c] += g[c] * (in[c] - m) * s;
      dbeta[c] += g[c];
    }
  }
}

}  // namespace gpipe::cpu
