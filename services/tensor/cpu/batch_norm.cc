#include "services/tensor/cpu/batch_norm.h"

#include <cmath>

#include "services/tensor/cpu/vector_clones.h"

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

// Each plane (one sample's channel) is summed in float lanes
// (vector_clones.h), and the planes' sums in double, in sample order: the
// lanes break the chain of dependent adds a plain loop is, and a plane is
// short enough (hundreds to thousands of floats) that its float sum loses
// nothing the double total would keep.
GPIPE_VECTOR_CLONES
void BatchNormForward(int64_t batch, int64_t channels, int64_t inner,
                      bool batch_stats, bool update_running, float momentum,
                      float eps, const float* x, const float* gamma,
                      const float* beta, float* running_mean,
                      float* running_var, float* y, float* saved_mean,
                      float* rstd, float* statistics) {
  const int64_t n = batch * inner;
#pragma omp parallel for if (batch * channels * inner > (1 << 15))
  for (int64_t c = 0; c < channels; ++c) {
    float mean, var;
    if (batch_stats) {
      double s = 0.0, ss = 0.0;
      for (int64_t b = 0; b < batch; ++b)
        s += LaneSum(inner, x + (b * channels + c) * inner);
      mean = static_cast<float>(s / n);
      for (int64_t b = 0; b < batch; ++b)
        ss += LaneSumSquaredDeviations(inner, x + (b * channels + c) * inner,
                                       mean);
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
    if (saved_mean != nullptr) saved_mean[c] = mean;
    const float g = gamma[c], bias = beta[c];
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t off = (b * channels + c) * inner;
      const float* in = x + off;
      float* out = y + off;
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i)
        out[i] = (in[i] - mean) * r * g + bias;
    }
  }
}

GPIPE_VECTOR_CLONES
void BatchNormBackward(int64_t batch, int64_t channels, int64_t inner,
                       const float* x, const float* mean, const float* rstd,
                       const float* gamma, const float* dy, float* dx,
                       float* dgamma, float* dbeta) {
  const int64_t n = batch * inner;
#pragma omp parallel for if (batch * channels * inner > (1 << 15))
  for (int64_t c = 0; c < channels; ++c) {
    // xhat = (x - mean) * rstd, the forward's operations on its operands.
    const float m = mean[c], r = rstd[c];
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t off = (b * channels + c) * inner;
      const float* g = dy + off;
      const float* in = x + off;
      sum_dy += LaneSum(inner, g);
      sum_dy_xhat += LaneSumOf(
          inner, [g, in, m, r](int64_t i) { return g[i] * ((in[i] - m) * r); });
    }
    dgamma[c] += static_cast<float>(sum_dy_xhat);
    dbeta[c] += static_cast<float>(sum_dy);
    const float k = gamma[c] * r / n;
    const float s = static_cast<float>(sum_dy);
    const float sx = static_cast<float>(sum_dy_xhat);
    const float nf = static_cast<float>(n);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t off = (b * channels + c) * inner;
      const float* g = dy + off;
      const float* in = x + off;
      float* out = dx + off;
#pragma omp simd
      for (int64_t i = 0; i < inner; ++i)
        out[i] = k * (nf * g[i] - s - (in[i] - m) * r * sx);
    }
  }
}

}  // namespace gpipe::cpu
