#include "services/tensor/cpu/batch_norm.h"

#include <cmath>

namespace gpipe::cpu {

void BatchNormForward(int64_t batch, int64_t channels, int64_t inner,
                      bool batch_stats, bool update_running, float momentum,
                      float eps, const float* x, const float* gamma,
                      const float* beta, float* running_mean,
                      float* running_var, float* y, float* xhat, float* rstd) {
  const int64_t n = batch * inner;
#pragma omp parallel for if (batch * channels * inner > (1 << 15))
  for (int64_t c = 0; c < channels; ++c) {
    float mean, var;
    if (batch_stats) {
      double s = 0.0, ss = 0.0;
      for (int64_t b = 0; b < batch; ++b) {
        const float* p = x + (b * channels + c) * inner;
        for (int64_t i = 0; i < inner; ++i) s += p[i];
      }
      mean = static_cast<float>(s / n);
      for (int64_t b = 0; b < batch; ++b) {
        const float* p = x + (b * channels + c) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          const double d = p[i] - mean;
          ss += d * d;
        }
      }
      var = static_cast<float>(ss / n);
      if (update_running) {
        const float unbiased = n > 1 ? static_cast<float>(ss / (n - 1)) : var;
        float& rm = running_mean[c];
        float& rv = running_var[c];
        rm = (1.0f - momentum) * rm + momentum * mean;
        rv = (1.0f - momentum) * rv + momentum * unbiased;
      }
    } else {
      mean = running_mean[c];
      var = running_var[c];
    }
    const float r = 1.0f / std::sqrt(var + eps);
    rstd[c] = r;
    const float g = gamma[c], bias = beta[c];
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t off = (b * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        const float h = (x[off + i] - mean) * r;
        if (xhat != nullptr) xhat[off + i] = h;
        y[off + i] = h * g + bias;
      }
    }
  }
}

void BatchNormBackward(int64_t batch, int64_t channels, int64_t inner,
                       const float* xhat, const float* rstd, const float* gamma,
                       const float* dy, float* dx, float* dgamma,
                       float* dbeta) {
  const int64_t n = batch * inner;
#pragma omp parallel for if (batch * channels * inner > (1 << 15))
  for (int64_t c = 0; c < channels; ++c) {
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t off = (b * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        sum_dy += dy[off + i];
        sum_dy_xhat += static_cast<double>(dy[off + i]) * xhat[off + i];
      }
    }
    dgamma[c] += static_cast<float>(sum_dy_xhat);
    dbeta[c] += static_cast<float>(sum_dy);
    const float k = gamma[c] * rstd[c] / n;
    const float s = static_cast<float>(sum_dy);
    const float sx = static_cast<float>(sum_dy_xhat);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t off = (b * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i)
        dx[off + i] = k * (n * dy[off + i] - s - xhat[off + i] * sx);
    }
  }
}

}  // namespace gpipe::cpu
