// Layer normalization over the last dimension, with affine parameters.
#ifndef GPIPE_SERVICES_TENSOR_CPU_LAYER_NORM_H_
#define GPIPE_SERVICES_TENSOR_CPU_LAYER_NORM_H_

#include <cstdint>

namespace gpipe::cpu {

// y = (x - mean) * rstd * gamma + beta per row; saves mean and rstd per row.
void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                      const float* gamma, const float* beta, float* y,
                      float* mean, float* rstd);

// dx is overwritten; dgamma and dbeta are accumulated (rows in order).
void LayerNormBackward(int64_t rows, int64_t cols, const float* x,
                       const float* mean, const float* rstd, const float* gamma,
                       const float* dy, float* dx, float* dgamma, float* dbeta);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_LAYER_NORM_H_
