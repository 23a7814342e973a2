#include "services/tensor/cpu/batch_norm.h"

#include <cmath>

namespace gpipe::cpu {

namespace {

// One formula for the update during a forward and the one held back for
// later (BatchNormMoveRunning): the same operations, so the same bits.
inline void MoveAverage(float momentum, float value, float& running) {
  running = (1.0f - momentum) * running + momentum * value;
}

}  // namespace

void BatchNormMoveRunning(int64_t channels, float momentum,
                          const float* statistics, float* running_mean,
                          float* running_var) {
  for (int64_t c = 0; c < channels; ++c) {
    MoveAverage(momentum, statistics[c], running_mean[c]);
    MoveAverage(momentum, statistics[channels + c], running_var[c]);
  }
}

void BatchNormForward(int64_t batch, int64_t channels, int64_t inner,
                      bool batch_stats, bool update_running, float momentum,
                      float eps, const float* x, const float* gamma,
                      const float* beta, float* running_mean,
                      float* running_var, float* y, float* xhat, float* rstd,
                      float* statistics) {
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
      const float unbiased = n > 1 ? static_cast<float>(ss / (n - 1)) : var;
      if (update_running) {
        MoveAverage(momentum, mean, running_mean[c]);
        MoveAverage(momentum, unbiased, running_var[c]);
      }
      if (statistics != nullptr) {
        statistics[c] = mean;
        statistics[channels + c] = unbiased;
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
