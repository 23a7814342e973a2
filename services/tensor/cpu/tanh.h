// tanh in float, branch-free and inline so a loop of it vectorizes (libm's
// tanhf is a call an element: 2% of the triad in elementwise_bench), with
// the same bits in every lane, clone and CPU, as normal.h's functions.
// Within 1.51 ulp of double tanh over the floats (tanh_test).
#ifndef GPIPE_SERVICES_TENSOR_CPU_TANH_H_
#define GPIPE_SERVICES_TENSOR_CPU_TANH_H_

#include <cmath>

#include "services/tensor/cpu/normal.h"

namespace gpipe::cpu {

[[gnu::always_inline]] inline float Tanh(float x) {
  const float a = std::fabs(x);
  // |x| < 0.55: tanh |x| = |x| + |x| s P(s), s = x^2, with P fitted (relative,
  // minimax) on that range to 1.1e-9, where (1 - e)/(1 + e) would lose
  // digits to the cancellation in 1 - e.
  const float s = x * x;
  float p = -0.006274226f;
  p = std::fma(p, s, 0.021071669f);
  p = std::fma(p, s, -0.05385231f);
  p = std::fma(p, s, 0.13332586f);
  p = std::fma(p, s, -0.33333316f);
  const float small = std::fma(a * s, p, a);
  // Otherwise tanh |x| = (1 - e)/(1 + e), e = exp(-2|x|) <= 1/3. Past 9.5
  // tanh rounds to 1; the clamp keeps exp's argument in its range, NaN
  // included (its comparison is false), and NaN is given back below.
  const float e = ExpOfSmall(-2.0f * (a < 9.5f ? a : 9.5f));
  const float large = (1.0f - e) / (1.0f + e);
  // Computed on |x| and signed last: odd to the bit, and -0 stays -0.
  const float t = std::copysign(a < 0.55f ? small : large, x);
  return std::isnan(x) ? x : t;
}

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_TANH_H_
