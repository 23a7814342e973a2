// One row's softmax, vectorized, for the softmax kernels and attention.
#ifndef GPIPE_SERVICES_TENSOR_CPU_SOFTMAX_ROW_H_
#define GPIPE_SERVICES_TENSOR_CPU_SOFTMAX_ROW_H_

#include <cstdint>

#include "services/tensor/cpu/normal.h"
#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {

// exp(a) for a <= 0.5 (a score minus its row's largest): normal.h's
// ExpOfSmall, which vectorizes where libm's expf is a call per element; 0
// below -87 (exp(-87) is near the smallest normal float, and anything
// smaller is flushed to 0 anyway); NaN stays NaN: it is not below -87, so
// it goes through ExpOfSmall's arithmetic, which keeps it (its exponent
// bits are only integer arithmetic). Two selects where testing for NaN
// took five vector operations of the loss's 29 an element group.
[[gnu::always_inline]] inline float ExpOfShifted(float a) {
  const float e = ExpOfSmall(-87.0f > a ? -87.0f : a);
  return a < -87.0f ? 0.0f : e;
}

// y = softmax(x[0..n)), n >= 1; y may be x. Its largest entry, its exps and
// their sum are each one pass over the row, all vectorized; the sum over
// fixed lanes, so the bits do not depend on the vector width.
[[gnu::always_inline]] inline void SoftmaxRow(int64_t n, const float* x,
                                              float* y) {
  const float m = LaneMax(n, x);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = ExpOfShifted(x[i] - m);
  const float inv = 1.0f / LaneSum(n, y);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
}

// The gradient through that softmax, times `scale`: dx = y (dy - y.dy)
// scale over [0, n); dx may be dy. (A scale of 1 changes no bit.)
[[gnu::always_inline]] inline void SoftmaxRowBackward(int64_t n, const float* y,
                                                      const float* dy,
                                                      float scale, float* dx) {
  const float dot = LaneDot(n, y, dy);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (dy[i] - dot) * scale;
}

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_SOFTMAX_ROW_H_
