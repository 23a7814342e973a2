#include "services/tensor/cpu/dropout_avx2.h"

#include "services/core/rng.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GPIPE_DROPOUT_AVX2 1
#endif

namespace gpipe::cpu {
namespace {

#if GPIPE_DROPOUT_AVX2
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kMul1 = 0xbf58476d1ce4e5b9ULL;
constexpr uint64_t kMul2 = 0x94d049bb133111ebULL;

// The low 64 bits of z * m in each lane: lo(z) lo(m) + (lo(z) hi(m) +
// hi(z) lo(m)) 2^32, the two cross products (mod 2^32) from one 32-bit
// multiply over all eight halves, against m_cross = (hi(m), lo(m)) a lane.
__attribute__((target("avx2"))) inline __m256i MulLow64(__m256i z, __m256i m_lo,
                                                        __m256i m_cross) {
  const __m256i cross = _mm256_mullo_epi32(z, m_cross);
  const __m256i upper = _mm256_add_epi64(
      _mm256_slli_epi64(cross, 32),
      _mm256_and_si256(cross, _mm256_set1_epi64x(~uint64_t{0xffffffffu})));
  return _mm256_add_epi64(_mm256_mul_epu32(z, m_lo), upper);
}

// SplitMix64(c - gamma) >> 40 in each lane, given c = the counter plus
// gamma: the mix's final z ^ (z >> 31) changes none of z's top 24 bits.
__attribute__((target("avx2"))) inline __m256i MixTop24(__m256i z) {
  const __m256i m1_lo = _mm256_set1_epi64x(kMul1 & 0xffffffffu);
  const __m256i m1_cross =
      _mm256_set1_epi64x(static_cast<int64_t>((kMul1 << 32) | (kMul1 >> 32)));
  const __m256i m2_lo = _mm256_set1_epi64x(kMul2 & 0xffffffffu);
  const __m256i m2_cross =
      _mm256_set1_epi64x(static_cast<int64_t>((kMul2 << 32) | (kMul2 >> 32)));
  z = MulLow64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), m1_lo, m1_cross);
  z = MulLow64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), m2_lo, m2_cross);
  return _mm256_srli_epi64(z, 40);
}

__attribute__((target("avx2"))) void DropoutRange(int64_t begin, int64_t end,
                                                  float p, uint64_t key,
                                                  float scale, const float* x,
                                                  float* y) {
  int64_t i = begin;
  // Lanes i..i+3 and i+4..i+7: SplitMix64 adds gamma to key + i gamma.
  const uint64_t c = key + static_cast<uint64_t>(i + 1) * kGamma;
  __m256i c0 =
      _mm256_setr_epi64x(c, c + kGamma, c + 2 * kGamma, c + 3 * kGamma);
  __m256i c1 = _mm256_add_epi64(c0, _mm256_set1_epi64x(4 * kGamma));
  const __m256i step = _mm256_set1_epi64x(8 * kGamma);
  // The two halves' 24-bit values, interleaved by the blend, back in order.
  const __m256i order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
  const __m256 vp = _mm256_set1_ps(p), vscale = _mm256_set1_ps(scale);
  const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f);
  for (; i + 8 <= end; i += 8) {
    const __m256i h0 = MixTop24(c0);
    const __m256i h1 = MixTop24(c1);
    c0 = _mm256_add_epi64(c0, step);
    c1 = _mm256_add_epi64(c1, step);
    const __m256i both =
        _mm256_blend_epi32(h0, _mm256_slli_epi64(h1, 32), 0xaa);
    const __m256i bits = _mm256_permutevar8x32_epi32(both, order);
    // UniformAt's float: the 24-bit integer, exact, times 2^-24.
    const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(bits), unit);
    const __m256 keep = _mm256_cmp_ps(u, vp, _CMP_GE_OQ);
    const __m256 kept = _mm256_mul_ps(_mm256_loadu_ps(x + i), vscale);
    _mm256_storeu_ps(y + i, _mm256_and_ps(keep, kept));
  }
  for (; i < end; ++i)
    y[i] = UniformAt(key, static_cast<uint64_t>(i)) >= p ? x[i] * scale : 0.0f;
}

// Each asked once: DropoutRangeAvx2 runs for every block of every dropout.
bool HasAvx2() {
  static const bool has =
      (__builtin_cpu_init(), __builtin_cpu_supports("avx2") != 0);
  return has;
}
bool HasAvx512Dq() {
  static const bool has =
      (__builtin_cpu_init(), __builtin_cpu_supports("avx512dq") != 0);
  return has;
}
#endif

}  // namespace

bool DropoutPrefersAvx2() {
#if GPIPE_DROPOUT_AVX2
  return HasAvx2() && !HasAvx512Dq();
#else
  return false;
#endif
}

bool DropoutRangeAvx2(int64_t begin, int64_t end, float p, uint64_t key,
                      const float* x, float* y) {
#if GPIPE_DROPOUT_AVX2
  if (!HasAvx2()) return false;
  DropoutRange(begin, end, p, key, 1.0f / (1.0f - p), x, y);
  return true;
#else
  (void)begin, (void)end, (void)p, (void)key, (void)x, (void)y;
  return false;
#endif
}

}  // namespace gpipe::cpu
