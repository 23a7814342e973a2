// The register tiles the blocked GEMM (gemm.cc) is built from, one per
// instruction set, and which of them this CPU runs.
#ifndef GPIPE_SERVICES_TENSOR_CPU_GEMM_TILES_H_
#define GPIPE_SERVICES_TENSOR_CPU_GEMM_TILES_H_

#include <cstdint>
#include <span>

namespace gpipe::cpu {

// One mr x nr tile of C from packed slivers of op(A) and op(B): ap holds
// depth groups of mr floats (a column of the sliver each), bp depth groups of
// nr floats (a row each). Every element of the tile is one chain of fused
// multiply-adds over the depth in order, c = fma(a_p, b_p, c), starting from
// the tile's own values (accumulate) or from +0, then multiplied by `scale`
// when it is not 1, then added to bias[j] (its column's) when `bias` is
// set: the same two roundings as a separate pass over C would make. A fused
// multiply-add rounds once whatever the vector width, so every tile computes
// the same bits: the width only decides how many elements run side by side.
// While it works, a tile pulls memory the next tiles will read into cache:
// at step p of its depth the line at prefetch + p * prefetch_step (and, for
// a step of 32 floats, the line after it); none when prefetch_step is 0.
// That is what lets stages on CPUs of different generations agree bitwise while
// each uses its widest vectors. No tile is larger than this (gemm.cc runs the
// tiles at C's edges on a copy of this size).
inline constexpr int64_t kMaxGemmTileFloats = 12 * 32;
// Nor wider than this: op(B) packed ahead (gemm.h's PackedB) pads its
// columns to a multiple of the tile's nr, at most this many.
inline constexpr int64_t kMaxGemmTileColumns = 32;

// How many slivers of rows make a product of few rows (GemmTile::kc_few_rows).
inline constexpr int64_t kFewRowSlivers = 4;

struct GemmTile {
  const char* name;  // "avx512", "avx2", "portable"
  int64_t mr;        // rows of C per tile
  int64_t nr;        // columns of C per tile
  int64_t mc;        // rows of op(A) packed at once: mr * mc * 4 B fit L2
  int64_t kc;        // depth per pass: a kc x nr sliver of B fits L1
  // Depth per pass of op(B) packed ahead for products of at most
  // kFewRowSlivers slivers of rows (a micro-batch of 32 samples); 0 where
  // not measured, and kc serves them too (gemm.cc's DepthBlock).
  int64_t kc_few_rows;
  void (*run)(int64_t depth, const float* ap, const float* bp, float* c,
              int64_t ldc, bool accumulate, float scale, const float* bias,
              const float* prefetch, int64_t prefetch_step);
  // The same for C's first `rows` rows only (0 < rows < mr; the sliver is
  // still packed mr wide), the same bits; null where a tile has none, and
  // gemm.cc then runs the whole tile on a copy.
  void (*run_rows)(int64_t rows, int64_t depth, const float* ap,
                   const float* bp, float* c, int64_t ldc, bool accumulate,
                   float scale, const float* bias, const float* prefetch,
                   int64_t prefetch_step);
};

// The tiles this CPU can run, widest first; the portable one (std::fma,
// any CPU) is always last.
std::span<const GemmTile* const> SupportedGemmTiles();

// The first of SupportedGemmTiles(): what Gemm uses, and what B packed
// ahead is packed for.
const GemmTile& BestGemmTile();
// The tile for a product n columns wide: BestGemmTile(), or a narrower one
// of the same instruction set that n fits (fewer padded columns computed).
// Every tile gives the same bits, so the choice is only speed.
const GemmTile& GemmTileFor(int64_t n);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_GEMM_TILES_H_
