#include "services/tensor/cpu/dropout_avx512.h"

#include "services/core/rng.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*,
// which -Wmaybe-uninitialized reports once inlined into a function with a
// target attribute: a false positive, in the compiler's own header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define GPIPE_DROPOUT_AVX512 1
#endif

namespace gpipe::cpu {
namespace {

#if GPIPE_DROPOUT_AVX512
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kMul1 = 0xbf58476d1ce4e5b9ULL;
constexpr uint64_t kMul2 = 0x94d049bb133111ebULL;

// SplitMix64(c - gamma) >> 40 in each lane, given c = the counter plus
// gamma: the mix's final z ^ (z >> 31) changes none of z's top 24 bits.
__attribute__((target("avx512f,avx512dq"))) inline __m512i MixTop24(__m512i z) {
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)),
                         _mm512_set1_epi64(static_cast<int64_t>(kMul1)));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)),
                         _mm512_set1_epi64(static_cast<int64_t>(kMul2)));
  return _mm512_srli_epi64(z, 40);
}

__attribute__((target("avx512f,avx512dq"))) void DropoutRange(
    int64_t begin, int64_t end, float p, uint64_t key, float scale,
    const float* x, float* y) {
  int64_t i = begin;
  // Lanes i..i+7 and i+8..i+15: SplitMix64 adds gamma to key + i gamma.
  const uint64_t c = key + static_cast<uint64_t>(i + 1) * kGamma;
  const __m512i lanes = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
  __m512i c0 = _mm512_add_epi64(
      _mm512_set1_epi64(static_cast<int64_t>(c)),
      _mm512_mullo_epi64(lanes,
                         _mm512_set1_epi64(static_cast<int64_t>(kGamma))));
  __m512i c1 =
      _mm512_add_epi64(c0, _mm512_set1_epi64(static_cast<int64_t>(8 * kGamma)));
  const __m512i step = _mm512_set1_epi64(static_cast<int64_t>(16 * kGamma));
  const __m512 vp = _mm512_set1_ps(p), vscale = _mm512_set1_ps(scale);
  const __m512 unit = _mm512_set1_ps(1.0f / 16777216.0f);
  for (; i + 16 <= end; i += 16) {
    // Each lane's 24 bits narrowed to 32-bit integers, in element order.
    const __m256i h0 = _mm512_cvtepi64_epi32(MixTop24(c0));
    const __m256i h1 = _mm512_cvtepi64_epi32(MixTop24(c1));
    c0 = _mm512_add_epi64(c0, step);
    c1 = _mm512_add_epi64(c1, step);
    const __m512i bits = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
    // UniformAt's float: the 24-bit integer, exact, times 2^-24.
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(bits), unit);
    const __mmask16 keep = _mm512_cmp_ps_mask(u, vp, _CMP_GE_OQ);
    _mm512_storeu_ps(y + i,
                     _mm512_maskz_mul_ps(keep, _mm512_loadu_ps(x + i), vscale));
  }
  for (; i < end; ++i)
    y[i] = UniformAt(key, static_cast<uint64_t>(i)) >= p ? x[i] * scale : 0.0f;
}

// Asked once: DropoutRangeAvx512 runs for every block of every dropout.
bool HasAvx512Dq() {
  static const bool has =
      (__builtin_cpu_init(), __builtin_cpu_supports("avx512f") != 0 &&
                                 __builtin_cpu_supports("avx512dq") != 0);
  return has;
}
#endif

}  // namespace

bool DropoutHasAvx512() {
#if GPIPE_DROPOUT_AVX512
  return HasAvx512Dq();
#else
  return false;
#endif
}

bool DropoutRangeAvx512(int64_t begin, int64_t end, float p, uint64_t key,
                        const float* x, float* y) {
#if GPIPE_DROPOUT_AVX512
  if (!HasAvx512Dq()) return false;
  DropoutRange(begin, end, p, key, 1.0f / (1.0f - p), x, y);
  return true;
#else
  (void)begin, (void)end, (void)p, (void)key, (void)x, (void)y;
  return false;
#endif
}

}  // namespace gpipe::cpu
