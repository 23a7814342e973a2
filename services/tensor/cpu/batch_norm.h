// Batch normalization over [batch, channels, inner] data, per channel.
// Statistics are summed channel by channel (each plane in fixed float lanes,
// the planes in double, in sample order), so they do not depend on the number
// of threads or the vector width.
#ifndef GPIPE_SERVICES_TENSOR_CPU_BATCH_NORM_H_
#define GPIPE_SERVICES_TENSOR_CPU_BATCH_NORM_H_

#include <cstdint>

namespace gpipe::cpu {

// With `batch_stats` the batch's mean and (biased) variance normalize, and
// when `update_running` the running averages move by `momentum` (PyTorch's
// convention, unbiased variance); otherwise the running averages normalize.
// Writes y, the per-channel 1/sqrt(var + eps) to `rstd`, and the mean that
// normalized to `mean` unless it is null (a backward recomputes the
// normalized input from x, mean and rstd, to the forward's bits: writing it
// whole was a fifth of batch norm's traffic). With `batch_stats` and a
// `statistics` of 2 x channels floats, also the batch's mean (first half) and
// unbiased variance (second half) there: what BatchNormMoveRunning takes to
// move the running averages later, to the same bits.
void BatchNormForward(int64_t batch, int64_t channels, int64_t inner,
                      bool batch_stats, bool update_running, float momentum,
                      float eps, const float* x, const float* gamma,
                      const float* beta, float* running_mean,
                      float* running_var, float* y, float* mean, float* rstd,
                      float* statistics = nullptr);
// Moves the running averages by one batch's `statistics` (as written by
// BatchNormForward), exactly as an updating forward of that batch would.
void BatchNormMoveRunning(int64_t channels, float momentum,
                          const float* statistics, float* running_mean,
                          float* running_var);
// dx (overwritten) from the forward's input x and its saved mean and rstd;
// dgamma and dbeta accumulate.
void BatchNormBackward(int64_t batch, int64_t channels, int64_t inner,
                       const float* x, const float* mean, const float* rstd,
                       const float* gamma, const float* dy, float* dx,
                       float* dgamma, float* dbeta);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_BATCH_NORM_H_
