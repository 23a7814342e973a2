#include "services/tensor/cpu/shallow_product.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <utility>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GPIPE_SHALLOW_AVX512 1
#endif

#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {
namespace {

// Up to this depth a product runs here: a first convolution's 9 (grey,
// 3 x 3) to 27 (RGB) taps.
constexpr int64_t kMostShallowDepth = 32;

// Each row of y is its own accumulator: its chains run a tap at a time
// across the row (a vector loop over j), where a loop over the taps inside
// one over j does not vectorize.
template <bool kBias>
[[gnu::always_inline]] inline void ProductRows(int64_t rows, int64_t n,
                                               int64_t depth, const float* w,
                                               const float* col, int64_t ldcol,
                                               const float* bias, float* y,
                                               int64_t ldy) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* const wi = w + i * depth;
    float* const yi = y + i * ldy;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) yi[j] = 0.0f;
    for (int64_t t = 0; t < depth; ++t) {
      const float wt = wi[t];
      const float* const ct = col + t * ldcol;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yi[j] = std::fma(wt, ct[j], yi[j]);
    }
    // With no bias nothing is added: acc + 0 would turn -0 into +0.
    if (kBias) {
      const float b = bias[i];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yi[j] = yi[j] + b;
    }
  }
}

#if GPIPE_SHALLOW_AVX512
// A block of up to 16 output channels, one lane each, and up to 16 taps,
// one register each: every position j is a gather of its 16 channels' dy
// (rows ld apart) and a fused multiply-add per tap with col[t, j]
// broadcast. Where the GEMM packed both operands for every sample (the
// first convolution's 9 x 16 transposed product: 7.9 us a sample in
// gemm_bench, 28.6 GFLOP/s), this reads them in place.
template <int kTaps>
__attribute__((target("avx512f"))) void GradientBlock(
    int64_t channels, int64_t n, const float* col, const float* dy, int64_t ld,
    float* dwt, int64_t ldw) {
  const __mmask16 lanes = static_cast<__mmask16>((uint32_t{1} << channels) - 1);
  const __m512i rows = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
      _mm512_set1_epi32(static_cast<int>(ld)));
  // Unrolled, so the accumulators stay in registers.
  __m512 acc[kTaps];
#pragma GCC unroll 16
  for (int t = 0; t < kTaps; ++t)
    acc[t] = _mm512_maskz_loadu_ps(lanes, dwt + t * ldw);
  for (int64_t j = 0; j < n; ++j) {
    const __m512 g =
        _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, rows, dy + j, 4);
#pragma GCC unroll 16
    for (int t = 0; t < kTaps; ++t)
      acc[t] = _mm512_fmadd_ps(_mm512_set1_ps(col[t * ld + j]), g, acc[t]);
  }
#pragma GCC unroll 16
  for (int t = 0; t < kTaps; ++t)
    _mm512_mask_storeu_ps(dwt + t * ldw, lanes, acc[t]);
}

using GradientBlockFn = void (*)(int64_t, int64_t, const float*, const float*,
                                 int64_t, float*, int64_t);

template <int... kTaps>
constexpr auto GradientBlocks(std::integer_sequence<int, kTaps...>) {
  return std::array<GradientBlockFn, sizeof...(kTaps)>{
      &GradientBlock<kTaps + 1>...};
}
constexpr auto kGradientBlocks =
    GradientBlocks(std::make_integer_sequence<int, kShallowGradientTaps>());
#endif

}  // namespace

bool ShallowWeightGradient(int64_t depth, int64_t channels, int64_t n,
                           const float* col, const float* dy, int64_t ld,
                           float* dwt) {
#if GPIPE_SHALLOW_AVX512
  static const bool avx512 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  if (!avx512 || depth < 1 || depth > kShallowGradientTaps) return false;
  // The gather's offsets are 32-bit: row 15 must lie within reach.
  if (15 * ld > INT32_MAX) return false;
  const GradientBlockFn block = kGradientBlocks[depth - 1];
  for (int64_t c = 0; c < channels; c += 16)
    block(std::min<int64_t>(16, channels - c), n, col, dy + c * ld, ld, dwt + c,
          channels);
  return true;
#else
  (void)depth, (void)channels, (void)n, (void)col, (void)dy, (void)ld,
      (void)dwt;
  return false;
#endif
}

bool ShallowDepth(int64_t depth) { return depth <= kMostShallowDepth; }

GPIPE_VECTOR_CLONES
void ShallowProduct(int64_t rows, int64_t n, int64_t depth, const float* w,
                    const float* col, int64_t ldcol, const float* bias,
                    float* y, int64_t ldy) {
  if (bias != nullptr)
    ProductRows<true>(rows, n, depth, w, col, ldcol, bias, y, ldy);
  else
    ProductRows<false>(rows, n, depth, w, col, ldcol, bias, y, ldy);
}

}  // namespace gpipe::cpu
