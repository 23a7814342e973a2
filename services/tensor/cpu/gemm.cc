#include "services/tensor/cpu/gemm.h"

#include <omp.h>

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include "services/tensor/cpu/gemm_tiles.h"

namespace gpipe::cpu {
namespace {

// The blocked product in the manner of BLIS (Van Zee and van de Geijn):
// op(B) is packed kc x nc at a time into slivers of nr columns, op(A) mc x
// kc at a time into slivers of mr rows, and a register tile (gemm_tiles.h)
// runs over every pair of slivers. Each element of C is one chain of fused
// multiply-adds over k in order: a pass over the next kc of the depth picks
// the chain up from C where the last pass stored it. So neither the blocks,
// nor the threads, nor the tile's vector width change a single bit, and each
// row of C depends on its row of op(A) alone, whatever m is.

// Columns of op(B) packed at once: kc x 2048 floats (2 MiB) live in L3.
constexpr int64_t kColumnBlock = 2048;
// Below this many multiply-adds (about 20 us on one AVX-512 core) a product
// runs on the calling thread: a team's start and barriers would cost more
// than the work, and far more when the team sleeps at barriers.
constexpr int64_t kParallelWork = int64_t{1} << 22;

// Below this depth a pass runs a block's tiles row sliver by row sliver,
// each across all its columns, where deeper passes go column sliver by
// column sliver down the rows. A shallow pass (a micro-batch's weight
// gradient: k = its rows, C the whole weight) does little work per tile and
// waits on C; along a row C streams from memory as the prefetcher likes,
// where down the rows every tile starts a dozen new streams. A deep pass
// keeps its B sliver in L1 down the rows instead. 1.4x faster steps of the
// width-1024 MLP at M = 8 (bench/README.md).
constexpr int64_t kShallowDepth = 128;
// A deep pass that starts C's chains (C only written: the first pass of a
// product with beta = 0) on at least this many floats of C also goes along
// the rows. Such a C is not in cache (a step's first weight gradient is
// the whole weight; a whole batch's forward), and each store down the rows
// waits for its line, a dozen new lines a tile, where along a row the
// prefetcher fetches them ahead. An eighth off the width-4096 MLP's
// weight gradient on its own, 2.5-5% off the steps of the size suite's
// MLPs and Transformer (bench/README.md).
// A micro-batch's smaller output stays in cache, and its B sliver in L1
// down the rows is worth more (the width-1024 MLP at M = 8 measured 6%
// slower along the rows).
constexpr int64_t kColdOutputFloats = int64_t{1} << 18;

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Blocks of about `most` (a multiple of `unit`) that cover `extent` evenly,
// so no block is a sliver left over.
int64_t EvenBlock(int64_t extent, int64_t most, int64_t unit) {
  const int64_t blocks = (extent + most - 1) / most;
  return RoundUp((extent + blocks - 1) / blocks, unit);
}

struct Operand {
  bool trans;
  const float* data;
  int64_t ld;
};

// out[p * width + j] = src[j * ld + p] for j < valid (the rows of src
// become the columns of the sliver), zero for valid <= j < width.
void PackTransposed(const float* src, int64_t ld, int64_t valid, int64_t width,
                    int64_t depth, float* out) {
  int64_t p = 0, whole = 0, paired = 0;
#if defined(__SSE2__)
  // 4 x 4 blocks through registers. Four rows of src are read a line's
  // worth (16 floats of the depth) at a time, four blocks, before the next
  // four rows: each line is used up while it is in L1. Four depth steps of
  // all the sliver's rows at a time, as before, kept a line of each of the
  // 32 rows waiting for its next use, and rows 4 KiB apart (a width-1024
  // weight) all map to one of L1's sets, 12 ways for 32 lines: every load
  // went to L2 (a 1024 x 1024 B^T packed in 366 us, now 127 us). The rows'
  // lines two ahead are prefetched, as each row is its own stream in its
  // own page (a weight from memory, 275 -> 190 us). The sliver's 16 x
  // width floats of a line's depth stay in L1 while they are written.
  // A pair of rows left (the AVX2 tile's 6 rows are 4 and 2) goes two
  // floats a step: element by element, those two rows cost as much as the
  // four before them.
  constexpr int64_t kLine = 16;  // floats
  constexpr int64_t kAhead = 2 * kLine;
  whole = valid / 4 * 4;
  paired = valid - whole >= 2 ? whole + 2 : whole;
  const int64_t depth4 = depth / 4 * 4;
  for (int64_t p0 = 0; p0 < depth4; p0 += kLine) {
    const int64_t p_end = std::min(depth4, p0 + kLine);
    for (int64_t j = 0; j < whole; j += 4) {
      // The address may lie past the source's end (its last lines): a
      // prefetch does not fault, and the address is made as an integer,
      // not by pointer arithmetic past the array.
      for (int64_t r = 0; r < 4; ++r) {
        const uintptr_t ahead =
            reinterpret_cast<uintptr_t>(src + (j + r) * ld + p0) +
            kAhead * sizeof(float);
        _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
      }
      for (p = p0; p < p_end; p += 4) {
        const float* s0 = src + j * ld + p;
        float* o = out + p * width;
        __m128 r0 = _mm_loadu_ps(s0), r1 = _mm_loadu_ps(s0 + ld);
        __m128 r2 = _mm_loadu_ps(s0 + 2 * ld), r3 = _mm_loadu_ps(s0 + 3 * ld);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
        _mm_storeu_ps(o + j, r0);
        _mm_storeu_ps(o + width + j, r1);
        _mm_storeu_ps(o + 2 * width + j, r2);
        _mm_storeu_ps(o + 3 * width + j, r3);
      }
    }
    if (paired > whole) {
      for (p = p0; p < p_end; p += 4) {
        const float* s0 = src + whole * ld + p;
        float* o = out + p * width;
        const __m128 r0 = _mm_loadu_ps(s0), r1 = _mm_loadu_ps(s0 + ld);
        const __m128 lo = _mm_unpacklo_ps(r0, r1), hi = _mm_unpackhi_ps(r0, r1);
        _mm_storel_pi(reinterpret_cast<__m64*>(o + whole), lo);
        _mm_storeh_pi(reinterpret_cast<__m64*>(o + width + whole), lo);
        _mm_storel_pi(reinterpret_cast<__m64*>(o + 2 * width + whole), hi);
        _mm_storeh_pi(reinterpret_cast<__m64*>(o + 3 * width + whole), hi);
      }
    }
  }
  p = depth4;
#endif
  // The depth's last steps of those columns, then the columns past them.
  for (int64_t j = 0; j < paired; ++j)
    for (int64_t q = p; q < depth; ++q) out[q * width + j] = src[j * ld + q];
  for (int64_t j = paired; j < valid; ++j)
    for (int64_t q = 0; q < depth; ++q) out[q * width + j] = src[j * ld + q];
  for (int64_t j = valid; j < width; ++j)
    for (int64_t q = 0; q < depth; ++q) out[q * width + j] = 0.0f;
}

// Columns [0, cols) of src's rows 0..depth-1 dealt out to slivers kWidth
// columns wide: sliver w's row p at out + (w * depth + p) * kWidth, the
// last sliver's columns past `cols` zero. src's rows are read along their
// length, a few at a time (sliver by sliver, a row's line was fetched again
// for every sliver it feeds, from a stride that can map the rows onto a
// few of L1's sets), and each sliver gets those rows as one contiguous
// run of whole lines: row by row, every store went to another sliver, a
// sliver's stride apart (3 KiB for an attention head's 128 positions),
// so each line was written in pieces while the next dozen slivers' lines
// competed for the same few sets. Each copy's size is known at compile
// time: a few vector moves, where a call to memcpy cost as much as the
// copy (a 6-float row of the AVX2 tile's A).
template <int64_t kWidth>
void DealRows(const float* src, int64_t ld, int64_t cols, int64_t depth,
              float* out) {
  // Rows dealt at once: 8 rows of a 6-wide sliver are 3 whole lines.
  constexpr int64_t kRows = 8;
  const int64_t whole = cols / kWidth, rest = cols - whole * kWidth;
  const int64_t sliver = kWidth * depth;
  for (int64_t p0 = 0; p0 < depth; p0 += kRows) {
    const int64_t rows = std::min(kRows, depth - p0);
    const float* const s0 = src + p0 * ld;
    float* const o0 = out + p0 * kWidth;
    for (int64_t w = 0; w < whole; ++w) {
      const float* s = s0 + w * kWidth;
      float* o = o0 + w * sliver;
      for (int64_t r = 0; r < rows; ++r, s += ld, o += kWidth)
        std::memcpy(o, s, kWidth * sizeof(float));
    }
    if (rest > 0) {
      const float* s = s0 + whole * kWidth;
      float* o = o0 + whole * sliver;
      for (int64_t r = 0; r < rows; ++r, s += ld, o += kWidth) {
        std::memcpy(o, s, rest * sizeof(float));
        std::fill(o + rest, o + kWidth, 0.0f);
      }
    }
  }
}

// DealRows for the widths the tiles' slivers have; false for another.
bool DealRowsOfWidth(int64_t width, const float* src, int64_t ld, int64_t cols,
                     int64_t depth, float* out) {
  switch (width) {
    case 4:
      DealRows<4>(src, ld, cols, depth, out);
      return true;
    case 6:
      DealRows<6>(src, ld, cols, depth, out);
      return true;
    case 8:
      DealRows<8>(src, ld, cols, depth, out);
      return true;
    case 12:
      DealRows<12>(src, ld, cols, depth, out);
      return true;
    case 16:
      DealRows<16>(src, ld, cols, depth, out);
      return true;
    case 32:
      DealRows<32>(src, ld, cols, depth, out);
      return true;
    default:
      return false;
  }
}

// out[p * width + j] = src[p * ld + j] for j < valid, zero past it.
void PackRows(const float* src, int64_t ld, int64_t valid, int64_t width,
              int64_t depth, float* out) {
  if (DealRowsOfWidth(width, src, ld, valid, depth, out)) return;
  for (int64_t p = 0; p < depth; ++p) {
    float* dst = out + p * width;
    std::memcpy(dst, src + p * ld, valid * sizeof(float));
    std::fill(dst + valid, dst + width, 0.0f);
  }
}

// Rows [r0, r0 + mr) of op(A) over depth [p0, p0 + depth) as depth groups
// of mr floats; rows past `rows` are zero.
void PackASliver(const Operand& a, int64_t r0, int64_t rows, int64_t mr,
                 int64_t p0, int64_t depth, float* out) {
  const int64_t valid = std::min(mr, rows);
  if (a.trans)
    PackRows(a.data + p0 * a.ld + r0, a.ld, valid, mr, depth, out);
  else
    PackTransposed(a.data + r0 * a.ld + p0, a.ld, valid, mr, depth, out);
}

// All the slivers of rows [r0, r0 + rows) of op(A), one after the other.
void PackABlock(const Operand& a, int64_t r0, int64_t rows, int64_t mr,
                int64_t p0, int64_t depth, float* out) {
  // op(A) = A^T: A's rows hold op(A)'s columns, dealt out whole.
  if (a.trans &&
      DealRowsOfWidth(mr, a.data + p0 * a.ld + r0, a.ld, rows, depth, out)) {
    return;
  }
  const int64_t slivers = (rows + mr - 1) / mr;
  for (int64_t s = 0; s < slivers; ++s)
    PackASliver(a, r0 + s * mr, rows - s * mr, mr, p0, depth,
                out + s * mr * depth);
}

// Columns [c0, c0 + nr) of op(B) over depth [p0, p0 + depth) as depth groups
// of nr floats; columns past `cols` are zero.
void PackBSliver(const Operand& b, int64_t c0, int64_t cols, int64_t nr,
                 int64_t p0, int64_t depth, float* out) {
  const int64_t valid = std::min(nr, cols);
  if (b.trans)
    PackTransposed(b.data + c0 * b.ld + p0, b.ld, valid, nr, depth, out);
  else
    PackRows(b.data + p0 * b.ld + c0, b.ld, valid, nr, depth, out);
}

// A tile at C's edge (past its last columns) runs on a full-size copy, so
// the tile's own code needs no edge cases; the padded rows and columns are
// computed and dropped. Out of line: its 1.6 KiB of copies on the stack
// made every tile's call set up that frame (7% of an attention head's
// scores product when RunTile held both ways).
[[gnu::noinline]] void RunEdgeTile(const GemmTile& tile, int64_t depth,
                                   const float* ap, const float* bp, float* c,
                                   int64_t ldc, int64_t rows, int64_t cols,
                                   bool accumulate, float scale,
                                   const float* bias, const float* pf,
                                   int64_t pf_step) {
  float edge[kMaxGemmTileFloats] = {};
  float edge_bias[kMaxGemmTileColumns] = {};
  rows = std::min(rows, tile.mr);
  cols = std::min(cols, tile.nr);
  if (accumulate)
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(edge + i * tile.nr, c + i * ldc, cols * sizeof(float));
  // The tile reads a whole row of bias: past C's last column it must not.
  if (bias != nullptr) std::memcpy(edge_bias, bias, cols * sizeof(float));
  tile.run(depth, ap, bp, edge, tile.nr, accumulate, scale,
           bias != nullptr ? edge_bias : nullptr, pf, pf_step);
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(c + i * ldc, edge + i * tile.nr, cols * sizeof(float));
}

// One tile of C: a whole one, or C's last rows on C itself where the tile
// has a version for fewer rows (GemmTile::run_rows), else on a copy.
[[gnu::always_inline]] inline void RunTile(const GemmTile& tile, int64_t depth,
                                           const float* ap, const float* bp,
                                           float* c, int64_t ldc, int64_t rows,
                                           int64_t cols, bool accumulate,
                                           float scale, const float* bias,
                                           const float* pf, int64_t pf_step) {
  if (cols >= tile.nr) {
    if (rows >= tile.mr) {
      tile.run(depth, ap, bp, c, ldc, accumulate, scale, bias, pf, pf_step);
      return;
    }
    if (tile.run_rows != nullptr) {
      tile.run_rows(rows, depth, ap, bp, c, ldc, accumulate, scale, bias, pf,
                    pf_step);
      return;
    }
  }
  RunEdgeTile(tile, depth, ap, bp, c, ldc, rows, cols, accumulate, scale, bias,
              pf, pf_step);
}

// The packed operands of the calling thread, kept between calls so a
// training step in steady state allocates (and faults in) nothing.
struct PackedOperands {
  std::vector<float> a, b;
};
PackedOperands& ThisThreadsPackedOperands() {
  thread_local PackedOperands packed;
  return packed;
}

// Columns of op(B) per block and depth per pass: functions of the shape
// and the tile, and for B packed ahead, of the rows it was packed for
// (`rows`; 0 for any, and for B packed by the product itself). Every depth
// gives the same bits: a pass picks each chain up where the last stored it.
int64_t DepthBlock(const GemmTile& tile, int64_t k, int64_t rows = 0) {
  const int64_t kc =
      tile.kc_few_rows > 0 && rows > 0 && rows <= kFewRowSlivers * tile.mr
          ? tile.kc_few_rows
          : tile.kc;
  // A depth up to a third past kc runs in one pass: its B sliver outgrows L1
  // a little, but C is loaded and stored once, not twice.
  return k <= kc + kc / 3 ? k : EvenBlock(k, kc, 1);
}
int64_t ColumnBlock(const GemmTile& tile, int64_t n) {
  return EvenBlock(n, kColumnBlock, tile.nr);
}

// Where block (jc, pc) of op(B) starts in B packed whole: the blocks lie in
// the order the product walks them, each padded to whole slivers.
int64_t PackedBlockOffset(const GemmTile& tile, int64_t n, int64_t k,
                          int64_t jc, int64_t pc) {
  const int64_t cols = std::min(ColumnBlock(tile, n), n - jc);
  return jc * k + RoundUp(cols, tile.nr) * pc;
}

// The depths [from, to) of a pass at `pass` (of `depth`) that a tile whose
// rows start at `row` runs, and whether it runs at all (GemmTriangle).
struct TileDepths {
  bool runs;
  int64_t from, to;
};
TileDepths DepthsOfTile(GemmTriangle triangle, const GemmTile& tile,
                        int64_t row, int64_t col, int64_t pass, int64_t depth) {
  switch (triangle) {
    case GemmTriangle::kLowerOutput:
      return {col < row + tile.mr, 0, depth};
    case GemmTriangle::kLowerA:
      return {true, 0, std::clamp(row + tile.mr - pass, int64_t{0}, depth)};
    case GemmTriangle::kUpperA:
      return {true, std::clamp(row - pass, int64_t{0}, depth), depth};
    case GemmTriangle::kFull:
      break;
  }
  return {true, 0, depth};
}

// C = scale * op(A) op(B), or C += op(A) op(B) chained from C (accumulate,
// scale 1), plus bias[j] on every row when `bias` is set (the last pass
// adds it as it stores C). With `packed_b_whole`, op(B) is read from there in
// its passes and not packed again.
void Blocked(const GemmTile& tile, const Operand& a, const Operand& b,
             int64_t m, int64_t n, int64_t k, float scale, bool accumulate,
             float* c, int64_t ldc, const PackedB* packed_b_whole,
             GemmTriangle triangle = GemmTriangle::kFull,
             const float* bias = nullptr) {
  const int64_t mr = tile.mr, nr = tile.nr;
  const int threads = !omp_in_parallel() && m * n * k >= kParallelWork
                          ? omp_get_max_threads()
                          : 1;
  const int64_t kc = packed_b_whole != nullptr ? packed_b_whole->depth_block()
                                               : DepthBlock(tile, k);
  // At least one block of rows per thread where m allows it (the blocking
  // changes no bit), and where it does not, the columns split too. A few
  // row slivers that do not share out evenly (m = 32 on two threads with
  // 12-row tiles: 24 rows and 8) are kept whole and the columns split
  // instead, where that leaves the busiest thread fewer tiles.
  const int64_t row_slivers_all = (m + mr - 1) / mr;
  const int64_t col_slivers_all = (n + nr - 1) / nr;
  const bool split_columns =
      threads > 1 && m <= tile.mc &&
      row_slivers_all * ((col_slivers_all + threads - 1) / threads) <
          (row_slivers_all + threads - 1) / threads * col_slivers_all;
  const int64_t mc =
      split_columns
          ? RoundUp(m, mr)
          : EvenBlock(
                m, std::min(tile.mc, RoundUp((m + threads - 1) / threads, mr)),
                mr);
  const int64_t row_blocks = (m + mc - 1) / mc;
  const int64_t col_groups =
      row_blocks >= threads ? 1 : (threads + row_blocks - 1) / row_blocks;
  const int64_t nc = ColumnBlock(tile, n);
  std::vector<float>& packed_b = ThisThreadsPackedOperands().b;
  if (packed_b_whole == nullptr &&
      static_cast<int64_t>(packed_b.size()) < nc * kc) {
    packed_b.resize(nc * kc);
  }
  // Every thread walks the same passes. The first `omp for` packs B's
  // slivers between all of them (unless B was packed ahead); in the second
  // each thread packs its own block of A's rows into a buffer of its own and
  // runs the block's tiles. Two barriers a pass: waking a sleeping team
  // (OMP_WAIT_POLICY=PASSIVE) costs tens of microseconds each.
#pragma omp parallel num_threads(threads) if (threads > 1)
  for (int64_t jc = 0; jc < n; jc += nc) {
    const int64_t cols = std::min(nc, n - jc);
    const int64_t col_slivers = (cols + nr - 1) / nr;
    const int64_t per_group = (col_slivers + col_groups - 1) / col_groups;
    for (int64_t pc = 0; pc < k; pc += kc) {
      const int64_t depth = std::min(kc, k - pc);
      const bool chained = accumulate || pc > 0;
      const bool last_pass = pc + depth == k;
      // Shallow passes run row sliver by row sliver (kShallowDepth), and
      // so do deep ones that only write a large C (kColdOutputFloats).
      const bool deep = depth >= kShallowDepth;
      const bool down_the_rows =
          deep && (chained || m * cols < kColdOutputFloats);
      const float pass_scale = last_pass ? scale : 1.0f;
      const float* const pass_bias =
          last_pass && bias != nullptr ? bias + jc : nullptr;
      const float* bp;
      if (packed_b_whole != nullptr) {
        bp = packed_b_whole->data() + PackedBlockOffset(tile, n, k, jc, pc);
      } else {
        float* const into = packed_b.data();
#pragma omp for schedule(static)
        for (int64_t s = 0; s < col_slivers; ++s)
          PackBSliver(b, jc + s * nr, cols - s * nr, nr, pc, depth,
                      into + s * nr * depth);
        bp = into;
      }
#pragma omp for collapse(2) schedule(static)
      for (int64_t block = 0; block < row_blocks; ++block) {
        for (int64_t group = 0; group < col_groups; ++group) {
          const int64_t js_begin = group * per_group;
          const int64_t js_end = std::min(col_slivers, js_begin + per_group);
          if (js_begin >= js_end) continue;  // more groups than slivers
          const int64_t ic = block * mc, rows = std::min(mc, m - ic);
          const int64_t row_slivers = (rows + mr - 1) / mr;
          std::vector<float>& packed_a = ThisThreadsPackedOperands().a;
          if (static_cast<int64_t>(packed_a.size()) < row_slivers * mr * depth)
            packed_a.resize(row_slivers * mr * depth);
          float* const ap = packed_a.data();
          PackABlock(a, ic, rows, mr, pc, depth, ap);
          // The next sliver of B into cache (the packed slivers lie one after
          // the other): in a training step B, a layer's packed weight, comes
          // from memory. A micro-batch's few rows reuse each sliver only a
          // few times, and a tile that asks for all of the next one waits
          // on memory (a core has few lines in flight) while the tiles
          // after it on the same sliver ask nothing. So where a sliver has
          // at most `sharers` tiles down the rows, they share the next one
          // out: each prefetches `share` floats a step (between half a line
          // and a line, so no line is skipped), and a tile with no share
          // runs without the prefetches' loads: 1.2x on the MLPs' 32-row
          // products with their weights in memory. Taller blocks, whose
          // compute hides the fetch anyway, and passes across the rows keep
          // every tile fetching the whole next sliver, which measured 2%
          // faster on the Transformer's 512-row micro-batches
          // (bench/README.md). share is 0 where the tiles do not share.
          constexpr int64_t kLine = 16;  // floats
          const int64_t sharers = (nr + kLine / 2 - 1) / (kLine / 2);
          const int64_t share =
              down_the_rows && row_slivers > 1 && row_slivers <= sharers
                  ? std::clamp((nr + row_slivers - 1) / row_slivers, kLine / 2,
                               kLine)
                  : 0;
          auto run = [&](int64_t is, int64_t js) {
            const TileDepths d = DepthsOfTile(triangle, tile, ic + is * mr,
                                              jc + js * nr, pc, depth);
            if (!d.runs) return;
            const float* const next = bp + (js + 1) * depth * nr;
            const float* pf = next + d.from * nr;
            int64_t pf_step = nr;
            if (share > 0) {
              pf = next + is * depth * share;
              pf_step = is * depth * share < depth * nr ? share : 0;
            }
            // A sliver's first `from` steps of the depth are its first
            // from * mr (or nr) floats: the tile starts past them. With no
            // depth left it still stores its chain's start (0, or C).
            RunTile(tile, d.to - d.from, ap + (is * depth + d.from) * mr,
                    bp + (js * depth + d.from) * nr,
                    c + (ic + is * mr) * ldc + jc + js * nr, ldc,
                    rows - is * mr, cols - js * nr, chained, pass_scale,
                    pass_bias != nullptr ? pass_bias + js * nr : nullptr, pf,
                    pf_step);
          };
          if (down_the_rows) {
            for (int64_t js = js_begin; js < js_end; ++js)
              for (int64_t is = 0; is < row_slivers; ++is) run(is, js);
          } else {
            for (int64_t is = 0; is < row_slivers; ++is)
              for (int64_t js = js_begin; js < js_end; ++js) run(is, js);
          }
        }
      }
    }
  }
}

// C = alpha * op(A) op(B) + beta * C for any alpha and beta, op(B) packed
// ahead when `packed_b_whole` is set. A triangle or a bias applies with
// beta = 0 only (C written, not read).
void Scaled(const GemmTile& tile, const Operand& op_a, const Operand& op_b,
            int64_t m, int64_t n, int64_t k, float alpha, float beta, float* c,
            int64_t ldc, const PackedB* packed_b_whole,
            GemmTriangle triangle = GemmTriangle::kFull,
            const float* bias = nullptr) {
  assert(beta == 0.0f || (triangle == GemmTriangle::kFull && bias == nullptr));
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {  // no pass to add a bias in
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const float v = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        c[i * ldc + j] = bias != nullptr ? v + bias[j] : v;
      }
    return;
  }
  if (beta == 0.0f) {
    Blocked(tile, op_a, op_b, m, n, k, alpha, false, c, ldc, packed_b_whole,
            triangle, bias);
  } else if (beta == 1.0f && alpha == 1.0f) {
    // Accumulating gradients: the chain starts from what C holds.
    Blocked(tile, op_a, op_b, m, n, k, 1.0f, true, c, ldc, packed_b_whole);
  } else {
    std::vector<float> product(m * n);
    Blocked(tile, op_a, op_b, m, n, k, alpha, false, product.data(), n,
            packed_b_whole);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        c[i * ldc + j] = product[i * n + j] + beta * c[i * ldc + j];
  }
}

}  // namespace

void GemmStridedOn(const GemmTile& tile, bool trans_a, bool trans_b, int64_t m,
                   int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, const float* b, int64_t ldb, float beta,
                   float* c, int64_t ldc) {
  Scaled(tile, Operand{trans_a, a, lda}, Operand{trans_b, b, ldb}, m, n, k,
         alpha, beta, c, ldc, nullptr);
}

void PackedB::PackOn(const GemmTile& tile, bool trans_b, int64_t k, int64_t n,
                     const float* b, int64_t ldb, int64_t rows) {
  tile_ = &tile;
  k_ = k;
  n_ = n;
  kc_ = DepthBlock(tile, k, rows);
  const Operand op_b{trans_b, b, ldb};
  const int64_t kc = kc_, nc = ColumnBlock(tile, n);
  // The size: where a block past the last column block would start.
  data_.resize(n == 0 ? 0
                      : PackedBlockOffset(tile, n, k, (n - 1) / nc * nc, k));
  const int64_t nr = tile.nr;
  for (int64_t jc = 0; jc < n; jc += nc) {
    const int64_t cols = std::min(nc, n - jc);
    const int64_t col_slivers = (cols + nr - 1) / nr;
    for (int64_t pc = 0; pc < k; pc += kc) {
      const int64_t depth = std::min(kc, k - pc);
      float* const into = data_.data() + PackedBlockOffset(tile, n, k, jc, pc);
      const bool team =
          !omp_in_parallel() && col_slivers * nr * depth >= kParallelWork / 64;
#pragma omp parallel for schedule(static) if (team)
      for (int64_t s = 0; s < col_slivers; ++s)
        PackBSliver(op_b, jc + s * nr, cols - s * nr, nr, pc, depth,
                    into + s * nr * depth);
    }
  }
}

void PackedB::Pack(bool trans_b, int64_t k, int64_t n, const float* b,
                   int64_t ldb, int64_t rows) {
  PackOn(BestGemmTile(), trans_b, k, n, b, ldb, rows);
}

void GemmTriangularOn(const GemmTile& tile, GemmTriangle triangle, bool trans_a,
                      bool trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float* a, int64_t lda, const float* b,
                      int64_t ldb, float* c, int64_t ldc) {
  Scaled(tile, Operand{trans_a, a, lda}, Operand{trans_b, b, ldb}, m, n, k,
         alpha, 0.0f, c, ldc, nullptr, triangle);
}

void GemmTriangular(GemmTriangle triangle, bool trans_a, bool trans_b,
                    int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, const float* b, int64_t ldb,
                    float* c, int64_t ldc) {
  GemmTriangularOn(GemmTileFor(n), triangle, trans_a, trans_b, m, n, k, alpha,
                   a, lda, b, ldb, c, ldc);
}

void GemmAddBias(bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, const float* bias,
                 float* c, int64_t ldc) {
  Scaled(GemmTileFor(n), Operand{false, a, lda}, Operand{trans_b, b, ldb}, m, n,
         k, 1.0f, 0.0f, c, ldc, nullptr, GemmTriangle::kFull, bias);
}

void GemmPackedBAddBias(int64_t m, const float* a, int64_t lda,
                        const PackedB& b, const float* bias, float* c,
                        int64_t ldc) {
  assert(b.packed());
  Scaled(b.tile(), Operand{false, a, lda}, Operand{false, nullptr, 0}, m, b.n(),
         b.k(), 1.0f, 0.0f, c, ldc, &b, GemmTriangle::kFull, bias);
}

void GemmPackedB(int64_t m, float alpha, const float* a, int64_t lda,
                 const PackedB& b, float beta, float* c, int64_t ldc) {
  assert(b.packed());
  // op(B) is never read: every pass takes its block from `b`.
  Scaled(b.tile(), Operand{false, a, lda}, Operand{false, nullptr, 0}, m, b.n(),
         b.k(), alpha, beta, c, ldc, &b);
}

void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float beta, float* c, int64_t ldc) {
  GemmStridedOn(GemmTileFor(n), trans_a, trans_b, m, n, k, alpha, a, lda, b,
                ldb, beta, c, ldc);
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c) {
  GemmStrided(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b,
              trans_b ? k : n, beta, c, n);
}

void GemmRowStable(int64_t m, int64_t n, int64_t k, const float* a,
                   const float* w, float* c) {
  Gemm(false, true, m, n, k, 1.0f, a, w, 0.0f, c);
}

bool TransposeFillsTilesBetter(int64_t m, int64_t n) {
  const auto padded = [](int64_t rows, int64_t cols) {
    const GemmTile& tile = GemmTileFor(cols);
    return RoundUp(rows, tile.mr) * RoundUp(cols, tile.nr);
  };
  return padded(n, m) < padded(m, n);
}

const char* GemmKernelName() { return BestGemmTile().name; }

}  // namespace gpipe::cpu
