#include "services/tensor/cpu/gemm_tiles.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GPIPE_GEMM_X86_TILES 1
#endif

namespace gpipe::cpu {
namespace {

// std::fma is one rounding on every CPU (in hardware where it has FMA, in
// libm's exact emulation where not), so this tile gives the vector tiles'
// bits anywhere, only slower.
template <int64_t kMr, int64_t kNr>
void PortableTile(int64_t depth, const float* ap, const float* bp, float* c,
                  int64_t ldc, bool accumulate, float scale, const float* bias,
                  const float*, int64_t) {
  float acc[kMr][kNr];
  for (int64_t i = 0; i < kMr; ++i)
    for (int64_t j = 0; j < kNr; ++j)
      acc[i][j] = accumulate ? c[i * ldc + j] : 0.0f;
  for (int64_t p = 0; p < depth; ++p, ap += kMr, bp += kNr)
    for (int64_t i = 0; i < kMr; ++i)
      for (int64_t j = 0; j < kNr; ++j)
        acc[i][j] = std::fma(ap[i], bp[j], acc[i][j]);
  for (int64_t i = 0; i < kMr; ++i)
    for (int64_t j = 0; j < kNr; ++j) {
      const float v = scale == 1.0f ? acc[i][j] : acc[i][j] * scale;
      c[i * ldc + j] = bias != nullptr ? v + bias[j] : v;
    }
}

constexpr GemmTile kPortable{"portable",         4,      8, 64, 256, 0,
                             PortableTile<4, 8>, nullptr};
static_assert(kPortable.mr * kPortable.nr <= kMaxGemmTileFloats);
static_assert(kPortable.nr <= kMaxGemmTileColumns);

#if GPIPE_GEMM_X86_TILES
// The 6 x 16 tile's steps over the depth for its first kRows rows, with or
// without a prefetch a step (a loop apiece, as the AVX-512 tiles).
template <int kRows, bool kPrefetch>
__attribute__((target("avx2,fma"), always_inline)) inline void Avx2Steps(
    int64_t depth, const float* ap, const float* bp, const float* pf,
    int64_t pf_step, __m256 (&acc0)[kRows], __m256 (&acc1)[kRows]) {
  constexpr int kMr = 6;  // the packed sliver's rows, whatever kRows
#pragma GCC unroll 2
  for (int64_t p = 0; p < depth; ++p, ap += kMr, bp += 16, pf += pf_step) {
    if constexpr (kPrefetch)
      _mm_prefetch(reinterpret_cast<const char*>(pf), _MM_HINT_T1);
    const __m256 b0 = _mm256_loadu_ps(bp);
    const __m256 b1 = _mm256_loadu_ps(bp + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kRows; ++i) {
      const __m256 a = _mm256_broadcast_ss(ap + i);
      acc0[i] = _mm256_fmadd_ps(a, b0, acc0[i]);
      acc1[i] = _mm256_fmadd_ps(a, b1, acc1[i]);
    }
  }
}

// 6 x 16: twelve accumulators, two rows of B and a broadcast of A in the
// sixteen ymm registers; each step of the depth is 12 FMAs on 2 loads.
// kRows < 6 is the tile for C's last rows (Avx2RowsTile).
template <int kRows>
__attribute__((target("avx2,fma"))) void Avx2TileOf(
    int64_t depth, const float* ap, const float* bp, float* c, int64_t ldc,
    bool accumulate, float scale, const float* bias, const float* pf,
    int64_t pf_step) {
  constexpr int kMr = kRows;
  __m256 acc0[kMr], acc1[kMr];
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) {
    acc0[i] = accumulate ? _mm256_loadu_ps(c + i * ldc) : _mm256_setzero_ps();
    acc1[i] =
        accumulate ? _mm256_loadu_ps(c + i * ldc + 8) : _mm256_setzero_ps();
  }
  if (pf_step > 0) {
    Avx2Steps<kRows, true>(depth, ap, bp, pf, pf_step, acc0, acc1);
  } else {
    Avx2Steps<kRows, false>(depth, ap, bp, pf, 0, acc0, acc1);
  }
  // Without this GCC keeps the tile's row addresses from the loads above
  // alive through the loop, in vector registers it then lacks for B.
  asm("" : "+r"(ldc));
  const __m256 s = _mm256_set1_ps(scale);
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) {
    if (scale != 1.0f) {
      acc0[i] = _mm256_mul_ps(acc0[i], s);
      acc1[i] = _mm256_mul_ps(acc1[i], s);
    }
    if (bias != nullptr) {
      acc0[i] = _mm256_add_ps(acc0[i], _mm256_loadu_ps(bias));
      acc1[i] = _mm256_add_ps(acc1[i], _mm256_loadu_ps(bias + 8));
    }
    _mm256_storeu_ps(c + i * ldc, acc0[i]);
    _mm256_storeu_ps(c + i * ldc + 8, acc1[i]);
  }
}

void Avx2Tile(int64_t depth, const float* ap, const float* bp, float* c,
              int64_t ldc, bool accumulate, float scale, const float* bias,
              const float* pf, int64_t pf_step) {
  Avx2TileOf<6>(depth, ap, bp, c, ldc, accumulate, scale, bias, pf, pf_step);
}

// C's last 1-5 rows on C itself: their chains are the full tile's, and the
// padded rows the full tile would compute on a copy (RunTile) cost a sixth
// to five sixths of its multiply-adds, a zeroed copy and a copy back. A
// 128-row product (an attention head's positions) ends in 2.
void Avx2RowsTile(int64_t rows, int64_t depth, const float* ap, const float* bp,
                  float* c, int64_t ldc, bool accumulate, float scale,
                  const float* bias, const float* pf, int64_t pf_step) {
  static constexpr decltype(&Avx2TileOf<1>) kByRows[] = {
      Avx2TileOf<1>, Avx2TileOf<2>, Avx2TileOf<3>, Avx2TileOf<4>,
      Avx2TileOf<5>};
  kByRows[std::clamp<int64_t>(rows, 1, 5) - 1](
      depth, ap, bp, c, ldc, accumulate, scale, bias, pf, pf_step);
}

// The AVX-512 tiles' prefetch hint. T1 (L2 only) is what the next sliver
// wants, but on AMD's Zen 4 and 5 a T1 prefetch is at times dropped, and
// the first tile on the sliver then waits on memory as if none was made: a
// 32-row product on a weight in memory ran at 133-152 GFLOP/s with T1 in
// some runs and 165-170 in others, where T0 held 150-175 in every one, and
// steps of the width-1024 MLP at 8 micro-batches ran 2-3% faster
// (bench/README.md). T0 also fills L1, which a sliver ahead outgrows: the
// lines fall back to L2 before they are read.
constexpr auto kAvx512PrefetchHint = _MM_HINT_T0;

// The 12 x 32 tile's steps over the depth for its first kRows rows, with
// kLines prefetches a step (none, the line at pf, or it and the next), a
// loop apiece: a test of the prefetch's stride inside the loop cost the
// compute-bound products ~1%.
template <int kRows, int kLines>
__attribute__((target("avx512f"), always_inline)) inline void Avx512Steps(
    int64_t depth, const float* ap, const float* bp, const float* pf,
    int64_t pf_step, __m512 (&acc0)[kRows], __m512 (&acc1)[kRows]) {
  constexpr int kMr = 12;  // the packed sliver's rows, whatever kRows
#pragma GCC unroll 2
  for (int64_t p = 0; p < depth; ++p, ap += kMr, bp += 32, pf += pf_step) {
    if constexpr (kLines > 0)
      _mm_prefetch(reinterpret_cast<const char*>(pf), kAvx512PrefetchHint);
    if constexpr (kLines > 1)
      _mm_prefetch(reinterpret_cast<const char*>(pf + 16), kAvx512PrefetchHint);
    const __m512 b0 = _mm512_loadu_ps(bp);
    const __m512 b1 = _mm512_loadu_ps(bp + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kRows; ++i) {
      const __m512 a = _mm512_set1_ps(ap[i]);
      acc0[i] = _mm512_fmadd_ps(a, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(a, b1, acc1[i]);
    }
  }
}

// 12 x 32: twenty-four accumulators and two rows of B in the 32 zmm
// registers, A broadcast from memory into each FMA. kRows < 12 is the tile
// for C's last rows (Avx512RowsTile).
template <int kRows>
__attribute__((target("avx512f"))) void Avx512TileOf(
    int64_t depth, const float* ap, const float* bp, float* c, int64_t ldc,
    bool accumulate, float scale, const float* bias, const float* pf,
    int64_t pf_step) {
  constexpr int kMr = kRows;
  __m512 acc0[kMr], acc1[kMr];
#pragma GCC unroll 12
  for (int i = 0; i < kMr; ++i) {
    acc0[i] = accumulate ? _mm512_loadu_ps(c + i * ldc) : _mm512_setzero_ps();
    acc1[i] =
        accumulate ? _mm512_loadu_ps(c + i * ldc + 16) : _mm512_setzero_ps();
  }
  if (pf_step == 0) {
    Avx512Steps<kRows, 0>(depth, ap, bp, pf, 0, acc0, acc1);
  } else if (pf_step > 16) {
    Avx512Steps<kRows, 2>(depth, ap, bp, pf, pf_step, acc0, acc1);
  } else {
    Avx512Steps<kRows, 1>(depth, ap, bp, pf, pf_step, acc0, acc1);
  }
  // Without this GCC keeps the tile's row addresses from the loads above
  // alive through the loop, in vector registers it then lacks for B.
  asm("" : "+r"(ldc));
  const __m512 s = _mm512_set1_ps(scale);
#pragma GCC unroll 12
  for (int i = 0; i < kMr; ++i) {
    if (scale != 1.0f) {
      acc0[i] = _mm512_mul_ps(acc0[i], s);
      acc1[i] = _mm512_mul_ps(acc1[i], s);
    }
    if (bias != nullptr) {
      acc0[i] = _mm512_add_ps(acc0[i], _mm512_loadu_ps(bias));
      acc1[i] = _mm512_add_ps(acc1[i], _mm512_loadu_ps(bias + 16));
    }
    _mm512_storeu_ps(c + i * ldc, acc0[i]);
    _mm512_storeu_ps(c + i * ldc + 16, acc1[i]);
  }
}

void Avx512Tile(int64_t depth, const float* ap, const float* bp, float* c,
                int64_t ldc, bool accumulate, float scale, const float* bias,
                const float* pf, int64_t pf_step) {
  Avx512TileOf<12>(depth, ap, bp, c, ldc, accumulate, scale, bias, pf, pf_step);
}

// C's last 1-11 rows on C itself, as Avx2RowsTile: a micro-batch of 32
// samples is 2 tiles and 8 rows, and the whole tile on a copy computed a
// ninth of such a product's multiply-adds for nothing.
void Avx512RowsTile(int64_t rows, int64_t depth, const float* ap,
                    const float* bp, float* c, int64_t ldc, bool accumulate,
                    float scale, const float* bias, const float* pf,
                    int64_t pf_step) {
  static constexpr decltype(&Avx512TileOf<1>) kByRows[] = {
      Avx512TileOf<1>, Avx512TileOf<2>,  Avx512TileOf<3>, Avx512TileOf<4>,
      Avx512TileOf<5>, Avx512TileOf<6>,  Avx512TileOf<7>, Avx512TileOf<8>,
      Avx512TileOf<9>, Avx512TileOf<10>, Avx512TileOf<11>};
  kByRows[std::clamp<int64_t>(rows, 1, 11) - 1](
      depth, ap, bp, c, ldc, accumulate, scale, bias, pf, pf_step);
}

// The 12 x 16 tile's steps over the depth for its first kRows rows, with or
// without a prefetch a step.
template <int kRows, bool kPrefetch>
__attribute__((target("avx512f"), always_inline)) inline void Avx512NarrowSteps(
    int64_t depth, const float* ap, const float* bp, const float* pf,
    int64_t pf_step, __m512 (&acc)[kRows]) {
  constexpr int kMr = 12;
#pragma GCC unroll 4
  for (int64_t p = 0; p < depth; ++p, ap += kMr, bp += 16, pf += pf_step) {
    if constexpr (kPrefetch)
      _mm_prefetch(reinterpret_cast<const char*>(pf), kAvx512PrefetchHint);
    const __m512 b = _mm512_loadu_ps(bp);
#pragma GCC unroll 12
    for (int i = 0; i < kRows; ++i)
      acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(ap[i]), b, acc[i]);
  }
}

// 12 x 16, for products at most 16 columns wide (a classifier's head, the
// first convolution's weight gradient): the 12 x 32 tile would compute as
// many padded columns as real ones. Twelve accumulators, one row of B, the
// same chains; kRows < 12 for C's last rows.
template <int kRows>
__attribute__((target("avx512f"))) void Avx512NarrowTileOf(
    int64_t depth, const float* ap, const float* bp, float* c, int64_t ldc,
    bool accumulate, float scale, const float* bias, const float* pf,
    int64_t pf_step) {
  constexpr int kMr = kRows;
  __m512 acc[kMr];
#pragma GCC unroll 12
  for (int i = 0; i < kMr; ++i)
    acc[i] = accumulate ? _mm512_loadu_ps(c + i * ldc) : _mm512_setzero_ps();
  if (pf_step > 0) {
    Avx512NarrowSteps<kRows, true>(depth, ap, bp, pf, pf_step, acc);
  } else {
    Avx512NarrowSteps<kRows, false>(depth, ap, bp, pf, 0, acc);
  }
  asm("" : "+r"(ldc));
  const __m512 s = _mm512_set1_ps(scale);
#pragma GCC unroll 12
  for (int i = 0; i < kMr; ++i) {
    if (scale != 1.0f) acc[i] = _mm512_mul_ps(acc[i], s);
    if (bias != nullptr) acc[i] = _mm512_add_ps(acc[i], _mm512_loadu_ps(bias));
    _mm512_storeu_ps(c + i * ldc, acc[i]);
  }
}

void Avx512NarrowTile(int64_t depth, const float* ap, const float* bp, float* c,
                      int64_t ldc, bool accumulate, float scale,
                      const float* bias, const float* pf, int64_t pf_step) {
  Avx512NarrowTileOf<12>(depth, ap, bp, c, ldc, accumulate, scale, bias, pf,
                         pf_step);
}

void Avx512NarrowRowsTile(int64_t rows, int64_t depth, const float* ap,
                          const float* bp, float* c, int64_t ldc,
                          bool accumulate, float scale, const float* bias,
                          const float* pf, int64_t pf_step) {
  static constexpr decltype(&Avx512NarrowTileOf<1>) kByRows[] = {
      Avx512NarrowTileOf<1>,  Avx512NarrowTileOf<2>, Avx512NarrowTileOf<3>,
      Avx512NarrowTileOf<4>,  Avx512NarrowTileOf<5>, Avx512NarrowTileOf<6>,
      Avx512NarrowTileOf<7>,  Avx512NarrowTileOf<8>, Avx512NarrowTileOf<9>,
      Avx512NarrowTileOf<10>, Avx512NarrowTileOf<11>};
  kByRows[std::clamp<int64_t>(rows, 1, 11) - 1](
      depth, ap, bp, c, ldc, accumulate, scale, bias, pf, pf_step);
}

// kc and mc were swept over square and `gemm_bench --suite sizes` shapes on
// one core (bench/README.md, "Our own GEMM"): a deeper pass stores and
// reloads C less often, and at 384 the kc x nr sliver of B is about L1's
// size (48 KiB for AVX-512) while mc x kc of A stays well inside L2.
// A product of 12-48 rows on a weight packed ahead in memory ran 7-15%
// faster with passes 1024 deep on a Zen 5 core (64 rows 2-3%, 96 and more
// not at all; bench/README.md): with three or four tiles on a sliver its B
// comes from L2 whatever the depth, and each pass reloads and stores every
// tile's C and starts the next pass's first sliver cold. kc_few_rows stays
// 0 on the tiles whose CPUs were not measured.
constexpr GemmTile kAvx2{"avx2", 6, 16, 240, 384, 0, Avx2Tile, Avx2RowsTile};
constexpr GemmTile kAvx512{"avx512", 12,   32,         144,
                           384,      1024, Avx512Tile, Avx512RowsTile};
constexpr GemmTile kAvx512Narrow{
    "avx512-narrow",     12, 16, 144, 384, 0, Avx512NarrowTile,
    Avx512NarrowRowsTile};
static_assert(kAvx2.mr * kAvx2.nr <= kMaxGemmTileFloats);
static_assert(kAvx512.mr * kAvx512.nr <= kMaxGemmTileFloats);
static_assert(kAvx512Narrow.mr * kAvx512Narrow.nr <= kMaxGemmTileFloats);
static_assert(kAvx2.nr <= kMaxGemmTileColumns);
static_assert(kAvx512.nr <= kMaxGemmTileColumns);
#endif

std::vector<const GemmTile*> FindSupportedTiles() {
  std::vector<const GemmTile*> tiles;
#if GPIPE_GEMM_X86_TILES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    tiles.push_back(&kAvx512);
    tiles.push_back(&kAvx512Narrow);
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    tiles.push_back(&kAvx2);
#endif
  tiles.push_back(&kPortable);
  return tiles;
}

}  // namespace

std::span<const GemmTile* const> SupportedGemmTiles() {
  static const std::vector<const GemmTile*> tiles = FindSupportedTiles();
  return tiles;
}

const GemmTile& BestGemmTile() { return *SupportedGemmTiles().front(); }

const GemmTile& GemmTileFor(int64_t n) {
  const GemmTile& best = BestGemmTile();
#if GPIPE_GEMM_X86_TILES
  if (&best == &kAvx512 && n <= kAvx512Narrow.nr) return kAvx512Narrow;
#endif
  (void)n;
  return best;
}

}  // namespace gpipe::cpu
