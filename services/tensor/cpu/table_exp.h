// exp by a table of 2^(i/16) and a polynomial of degree 3, for the loss over
// a language model's vocabulary, where the exps are most of the work.
#ifndef GPIPE_SERVICES_TENSOR_CPU_TABLE_EXP_H_
#define GPIPE_SERVICES_TENSOR_CPU_TABLE_EXP_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "services/tensor/cpu/normal.h"

namespace gpipe::cpu {

// 2^(i/16) for i = 0..15, each rounded to the nearest float, as bits: one
// AVX-512 register, two AVX2 ones.
inline constexpr uint32_t kExp2SixteenthsBits[16] = {
    0x3f800000u, 0x3f85aac3u, 0x3f8b95c2u, 0x3f91c3d3u,
    0x3f9837f0u, 0x3f9ef532u, 0x3fa5fed7u, 0x3fad583fu,
    0x3fb504f3u, 0x3fbd08a4u, 0x3fc5672au, 0x3fce248cu,
    0x3fd744fdu, 0x3fe0ccdfu, 0x3feac0c7u, 0x3ff5257du};

// The reduction's constants in sixteenths of ln2: a = (16 k + i) ln2 / 16 +
// r. Scaling normal.h's by 16 is exact, and ln2hi / 16 keeps its trailing
// zeros, so (16 k + i) ln2hi / 16 is exact for the |16 k + i| <= 2008 of
// a >= -87.
inline constexpr float kSixteenLog2e = 16.0f * kLog2e;
inline constexpr float kLn2HiSixteenth = kLn2Hi / 16.0f;
inline constexpr float kLn2LoSixteenth = kLn2Lo / 16.0f;
inline constexpr uint32_t kRoundBits = 0x4b400000u;  // kRound: 1.5 * 2^23
inline constexpr float kTableExpFloor = -87.0f;

// exp(a) for a <= 0.5 (a logit minus its row's running largest): 0 below
// -87 (exp(-87) is near the smallest normal float); NaN stays NaN.
// With |r| <= ln2 / 32, e^r - 1 = r (1 + r/2 + r^2/6) leaves out r^4/24,
// below 1e-8; the result is t + t q in one rounding, t the table's entry
// times 2^k, so its error is the entry's half ulp and that rounding's
// (1.07 ulp at worst over every float of [-87, 0.5] against double exp;
// tensor_loss_blocks_test samples it). ExpOfSmall's degree 6 takes nine
// multiply-adds and a multiply a vector, this six, a multiply and a lookup.
// The vector kernels in loss_blocks_*.cc do these operations in this order
// in each lane, so every one gives these bits.
[[gnu::always_inline]] inline float TableExp(float a) {
  // NaN passes (its comparison is false); k then comes from its bits and t
  // is any float, but q is NaN, so the result is.
  const float c = kTableExpFloor > a ? kTableExpFloor : a;
  const float j = std::fma(c, kSixteenLog2e, kRound);
  const float kf = j - kRound;
  const float r =
      std::fma(kf, -kLn2LoSixteenth, std::fma(kf, -kLn2HiSixteenth, c));
  uint32_t m;  // 16 k + i, in two's complement
  std::memcpy(&m, &j, sizeof m);
  m -= kRoundBits;
  // 2^k joins the entry's exponent: t stays normal, as the entries are in
  // [1, 2) and k >= -126.
  const uint32_t t_bits =
      kExp2SixteenthsBits[m & 15] + ((m << 19) & 0xff800000u);
  float t;
  std::memcpy(&t, &t_bits, sizeof t);
  const float q = std::fma(std::fma(1.0f / 6.0f, r, 0.5f), r, 1.0f) * r;
  const float e = std::fma(t, q, t);
  return a < kTableExpFloor ? 0.0f : e;
}

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_TABLE_EXP_H_
