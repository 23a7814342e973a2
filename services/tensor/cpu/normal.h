// The standard normal distribution's cdf Phi(x) and density phi(x) in float,
// for the exact (erf) GELU: x Phi(x) and its derivative Phi(x) + x phi(x).
// Within 6 ulp of the true values over all floats where they are normal
// numbers (measured against double erfc and exp on every 97th float of
// [-14, 14]: Phi 5.0, phi 2.0, GELU 5.1 ulp at worst), tails included,
// where 0.5 (1 + erff(x / sqrt 2)) loses every digit. Branch-free (selects)
// and inline, so a loop of it vectorizes (with -fno-trapping-math, which
// lets GCC compute both sides of a select); each lane does the scalar
// arithmetic, so the bits are the same in every lane and in a scalar loop.
// The polynomials step by std::fma: one instruction in the vector clones
// (vector_clones.h), half the operations of a multiply and an add, and the
// same correctly rounded result where libm computes it. GELU is bound by
// its arithmetic, not by memory (about 50 vector instructions an element
// group), so every operation saved is time: see Normal.
#ifndef GPIPE_SERVICES_TENSOR_CPU_NORMAL_H_
#define GPIPE_SERVICES_TENSOR_CPU_NORMAL_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace gpipe::cpu {

// The range reduction's constants: log2(e); 1.5 * 2^23, whose addition
// rounds to an integer; ln2 in two parts (Cody and Waite), the first with
// 12 trailing zero bits (0x3f317200), so k ln2hi is exact for |k| < 2^12.
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kRound = 12582912.0f;
inline constexpr float kLn2Hi = 0.693145752f;
inline constexpr float kLn2Lo = 1.42860677e-06f;

// e^r for |r| <= ln2/2 (a hair past it: the reduced argument's rounding
// and ExpOfMinusHalfSum's b), times 2^k from the exponent bits. A
// polynomial of degree 6 with its first two coefficients 1, fitted
// (relative, minimax, each coefficient refitted after the ones above it
// were rounded to float) to 3.6e-9, where the Taylor series needed degree 7
// for 7e-9: a multiply-add less for every exp of the GELU, the softmaxes
// and tanh.
inline constexpr float kExpC2 = 0.49999994f, kExpC3 = 0.16666521f,
                       kExpC4 = 0.041668389f, kExpC5 = 0.0083687454f,
                       kExpC6 = 0.0013814539f;

// p * 2^k from the exponent bits.
[[gnu::always_inline]] inline float TimesTwoTo(float p, int32_t k) {
  const uint32_t bits = static_cast<uint32_t>(k + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

[[gnu::always_inline]] inline float ExpReduced(float r, int32_t k) {
  float p = kExpC6;
  p = std::fma(p, r, kExpC5);
  p = std::fma(p, r, kExpC4);
  p = std::fma(p, r, kExpC3);
  p = std::fma(p, r, kExpC2);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  return TimesTwoTo(p, k);
}

// exp(a) for a in [-87, 0.5]: a = k ln2 + r with |r| <= ln2/2 (Cody and
// Waite's two-part ln2, so k ln2 is exact), then ExpReduced (measured over
// every float of [-87, 0.5] against double exp: 0.88 ulp at worst; 0.94
// with the Taylor series to r^7). The steps are fused and k read from j's
// bits, as in ExpOfMinusHalfSum: 4 operations for the reduction where separate
// ones took 7 and a conversion.
[[gnu::always_inline]] inline float ExpOfSmall(float a) {
  const float j = std::fma(a, kLog2e, kRound);
  const float kf = j - kRound;
  const float r = std::fma(kf, -kLn2Lo, std::fma(kf, -kLn2Hi, a));
  uint32_t j_bits;
  std::memcpy(&j_bits, &j, sizeof j_bits);
  return ExpReduced(r, static_cast<int32_t>(j_bits - 0x4b400000u));
}

// exp(-(u + b)/2) for u in [0, 174] and |b| within an ulp of u: ExpOfSmall's
// reduction of a = -u/2 with b joining the reduced argument, and
// ExpReduced, where every step is carried out on -2 times its value: the
// reduced argument s = -2r, ln2 and log2(e) scaled by 2 and -1/2 and the
// polynomial's coefficient of r^i by (-1/2)^i. Scaling by a power of two
// commutes with rounding away from float's smallest normals, which only
// |x| < 2^-63 brings u near, and there both ways give e^0 = 1. So the
// result is ExpReduced(r, k)'s bit for bit (compared on every float x for
// u = x^2, with and without subnormals flushed), without the multiply
// that forms -u/2.
[[gnu::always_inline]] inline float ExpOfMinusHalfSum(float u, float b) {
  // j = 1.5 * 2^23 + k exactly, so k is j's low mantissa bits: no
  // float-to-int conversion.
  const float j = std::fma(u, -0.5f * kLog2e, kRound);
  const float kf = j - kRound;
  const float s =
      std::fma(kf, 2.0f * kLn2Lo, std::fma(kf, 2.0f * kLn2Hi, u)) + b;
  float p = kExpC6 * (1.0f / 64);
  p = std::fma(p, s, kExpC5 * (-1.0f / 32));
  p = std::fma(p, s, kExpC4 * (1.0f / 16));
  p = std::fma(p, s, kExpC3 * (-1.0f / 8));
  p = std::fma(p, s, kExpC2 * (1.0f / 4));
  p = std::fma(p, s, -0.5f);
  p = std::fma(p, s, 1.0f);
  uint32_t j_bits;
  std::memcpy(&j_bits, &j, sizeof j_bits);
  return TimesTwoTo(p, static_cast<int32_t>(j_bits - 0x4b400000u));
}

struct NormalAt {
  float cdf;  // Phi(x)
  float pdf;  // phi(x)
};

[[gnu::always_inline]] inline NormalAt Normal(float x) {
  const float ax = std::fabs(x);
  // x^2 = u + lo exactly (the fma gives the product's rounding error), so
  // exp(-x^2/2) loses nothing to the rounding of x^2 (which would cost
  // x^2/2 relative, 85 ulp at the far tail). The halving of -x^2/2 is
  // folded into the constants below, exactly (ExpOfMinusHalfSum), a
  // multiply less: 9% off the GELU's forward (bench/README.md).
  const float u = x * x;
  const float lo = std::fma(x, x, -u);
  // u kept in ExpOfMinusHalfSum's range (NaN too: its comparison is
  // false); phi and the tail below float's range are 0.
  const float ea = ExpOfMinusHalfSum(u <= 174.0f ? u : 174.0f, lo);
  const float e = u > 174.0f ? 0.0f : ea;
  // With z = |x|/sqrt2 and s = z^2 = u/2, and the constants folded into the
  // coefficients, an operation less each:
  // z < 1/2: Phi(-|x|) = 1/2 - erf(z)/2, erf(z) = z P(s) with P fitted
  // (least squares, relative) on [0, 1/2] to 1.5e-9; below, P/(2 sqrt2),
  // its coefficient of s^i halved i times to take u.
  float p = 0.00167164986f * (1.0f / 16);
  p = std::fma(p, u, -0.00946202874f * (1.0f / 8));
  p = std::fma(p, u, 0.0398911424f * (1.0f / 4));
  p = std::fma(p, u, -0.132980675f * (1.0f / 2));
  p = std::fma(p, u, 0.398942292f);
  // Otherwise Phi(-|x|) = erfc(z)/2 = exp(-z^2) Q(t)/2, t = 1/(1 + z/2),
  // Q fitted on z in [1/2, 10] to 1.6e-9 relative; below, Q/2.
  const float t = 1.0f / std::fma(0.353553385f, ax, 1.0f);
  float q = -0.0377383828f;
  q = std::fma(q, t, 0.177803457f);
  q = std::fma(q, t, -0.309356689f);
  q = std::fma(q, t, 0.207093f);
  q = std::fma(q, t, -0.0565243252f);
  q = std::fma(q, t, 0.118721016f);
  q = std::fma(q, t, 0.117143482f);
  q = std::fma(q, t, 0.141865522f);
  q = std::fma(q, t, 0.140986025f);
  q = std::fma(q, t, 2.01239254e-06f);
  const float half_erfc = e * q;
  // Both ways computed, then chosen.
  const float lower =  // Phi(-|x|)
      u < 0.5f ? std::fma(-ax, p, 0.5f) : half_erfc;
  return {x < 0 ? lower : 1.0f - lower, e * 0.398942280401432678f};
}

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_NORMAL_H_
