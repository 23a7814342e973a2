// Our blocked GEMM: every register tile the CPU runs gives the bits of one
// fused multiply-add chain per element, so results cannot depend on the
// tile's width, the blocking, the threads or the number of rows.
#include "services/tensor/cpu/gemm.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/tensor/cpu/gemm_tiles.h"
#include "services/tensor/threads.h"

namespace gpipe {
namespace {

std::vector<float> Random(int64_t n, uint64_t key) {
  std::vector<float> v(n);
  Rng rng(key);
  for (float& x : v) x = static_cast<float>(rng.Normal());
  return v;
}

struct Shape {
  bool ta, tb;
  int64_t m, n, k;
};

// The definition, one element at a time: C = alpha * chain + beta * C, the
// chain starting from C itself when alpha = beta = 1.
void ChainReference(const Shape& s, float alpha, const float* a, int64_t lda,
                    const float* b, int64_t ldb, float beta, float* c,
                    int64_t ldc) {
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      float& out = c[i * ldc + j];
      const bool chained = alpha == 1.0f && beta == 1.0f;
      float acc = chained ? out : 0.0f;
      for (int64_t p = 0; p < s.k; ++p) {
        const float x = s.ta ? a[p * lda + i] : a[i * lda + p];
        const float y = s.tb ? b[j * ldb + p] : b[p * ldb + j];
        acc = std::fma(x, y, acc);
      }
      if (chained) {
        out = acc;
      } else {
        if (alpha != 1.0f) acc *= alpha;
        out = beta == 0.0f ? acc : acc + beta * out;
      }
    }
}

std::string Describe(const cpu::GemmTile& tile, const Shape& s, float alpha,
                     float beta) {
  return std::string(tile.name) + " " + (s.ta ? "T" : "N") +
         (s.tb ? "T" : "N") + " " + std::to_string(s.m) + "x" +
         std::to_string(s.n) + "x" + std::to_string(s.k) +
         " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta);
}

TEST(Gemm, EveryTileIsTheFusedChainBitwise) {
  // Edges in m and n for every tile (12 x 32, 6 x 16, 4 x 8), depths that
  // take one, two and three passes, sizes spanning several blocks, and short
  // or narrow products (a micro-batch's rows, a classifier's head).
  const Shape shapes[] = {
      {false, false, 1, 1, 1},      {false, true, 13, 33, 7},
      {true, false, 7, 17, 385},    {true, true, 25, 5, 770},
      {false, true, 150, 70, 1000}, {false, false, 300, 40, 90},
      {true, false, 11, 2100, 20},  {false, true, 30, 200, 500},
      {true, true, 40, 100, 800},   {false, false, 100, 50, 900},
      {false, false, 64, 96, 100},  {true, false, 65, 64, 50},
      {false, false, 20, 40, 600},  {true, true, 9, 48, 130},
      {false, false, 3, 16, 5}};
  const std::pair<float, float> scalings[] = {
      {1.0f, 0.0f}, {1.0f, 1.0f}, {0.125f, 0.0f}, {0.5f, 2.0f}, {1.0f, -1.0f}};
  for (const cpu::GemmTile* tile : cpu::SupportedGemmTiles()) {
    for (const Shape& s : shapes) {
      // Leading dimensions past the shape, as in attention's strided heads.
      const int64_t lda = (s.ta ? s.m : s.k) + 3;
      const int64_t ldb = (s.tb ? s.k : s.n) + 5;
      const int64_t ldc = s.n + 2;
      const std::vector<float> a = Random((s.ta ? s.k : s.m) * lda, 1);
      const std::vector<float> b = Random((s.tb ? s.n : s.k) * ldb, 2);
      const std::vector<float> c0 = Random(s.m * ldc, 3);
      for (auto [alpha, beta] : scalings) {
        std::vector<float> want = c0, got = c0;
        ChainReference(s, alpha, a.data(), lda, b.data(), ldb, beta,
                       want.data(), ldc);
        cpu::GemmStridedOn(*tile, s.ta, s.tb, s.m, s.n, s.k, alpha, a.data(),
                           lda, b.data(), ldb, beta, got.data(), ldc);
        // Bitwise, the gap between rows (columns n..ldc) included: it must
        // be left as it was.
        ASSERT_EQ(got, want) << Describe(*tile, s, alpha, beta);
      }
    }
  }
}

TEST(Gemm, PassesThatOnlyWriteALargeCAreTheFusedChainBitwise) {
  // At least 2^18 floats of C written, not read (beta = 0): the deep
  // passes that start the chains go along C's rows instead of down them
  // (gemm.cc, kColdOutputFloats); one pass, and two or more (the later
  // passes continue the chains down the rows).
  const Shape shapes[] = {{false, true, 264, 1000, 200},
                          {true, false, 260, 1010, 600}};
  for (const cpu::GemmTile* tile : cpu::SupportedGemmTiles()) {
    for (const Shape& s : shapes) {
      const int64_t lda = s.ta ? s.m : s.k, ldb = s.tb ? s.k : s.n;
      const std::vector<float> a = Random((s.ta ? s.k : s.m) * lda, 4);
      const std::vector<float> b = Random((s.tb ? s.n : s.k) * ldb, 5);
      std::vector<float> want(s.m * s.n, 7.0f), got(s.m * s.n, 7.0f);
      ChainReference(s, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, want.data(),
                     s.n);
      cpu::GemmStridedOn(*tile, s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda,
                         b.data(), ldb, 0.0f, got.data(), s.n);
      ASSERT_EQ(got, want) << Describe(*tile, s, 1.0f, 0.0f);
    }
  }
}

// op(A) for a triangular product: zero above (lower) or below (upper) the
// diagonal, with -0 among the zeros (a softmax gradient's underflowed
// entries) and in the kept half.
std::vector<float> Triangular(const Shape& s, int64_t lda, bool lower,
                              uint64_t key) {
  std::vector<float> a = Random((s.ta ? s.k : s.m) * lda, key);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t p = 0; p < s.k; ++p) {
      float& x = s.ta ? a[p * lda + i] : a[i * lda + p];
      const bool zero = lower ? p > i : p < i;
      const bool negative_zero = (i * 7 + p * 3) % 5 == 0;
      if (zero || (i + p) % 11 == 0) x = negative_zero ? -0.0f : 0.0f;
    }
  return a;
}

TEST(Gemm, TriangularProductsAreTheFullChainBitwise) {
  // Causal attention's products (GemmTriangle) on every tile: the tiles it
  // skips or shortens change no bit of what it keeps. Square operands from
  // one element to two passes of the depth, with t x dh and t x t results.
  for (const cpu::GemmTile* tile : cpu::SupportedGemmTiles()) {
    for (int64_t t : {1, 5, 13, 40, 100, 397, 600}) {
      if (std::string(tile->name) == "portable" && t > 100) continue;
      for (int64_t dh : {1, 16, 64}) {
        for (bool ta : {false, true}) {
          for (float alpha : {1.0f, 0.125f}) {
            // P V and dS K (lower), P^T dO and dS^T Q (upper): t x dh.
            for (bool lower : {true, false}) {
              const Shape s{ta, false, t, dh, t};
              const int64_t lda = t + 3, ldb = dh + 5, ldc = dh + 2;
              const std::vector<float> a = Triangular(s, lda, lower, 20);
              const std::vector<float> b = Random(t * ldb, 21);
              std::vector<float> want(t * ldc, 7.0f), got = want;
              ChainReference(s, alpha, a.data(), lda, b.data(), ldb, 0.0f,
                             want.data(), ldc);
              cpu::GemmTriangularOn(*tile,
                                    lower ? cpu::GemmTriangle::kLowerA
                                          : cpu::GemmTriangle::kUpperA,
                                    ta, false, t, dh, t, alpha, a.data(), lda,
                                    b.data(), ldb, got.data(), ldc);
              ASSERT_EQ(got, want) << Describe(*tile, s, alpha, 0.0f)
                                   << (lower ? " lower A" : " upper A");
            }
            // Q K^T and dO V^T: t x t, the lower half kept.
            const Shape s{ta, true, t, t, dh};
            const int64_t lda = (ta ? t : dh) + 3, ldb = dh + 5, ldc = t + 2;
            const std::vector<float> a = Random((ta ? dh : t) * lda, 22);
            const std::vector<float> b = Random(t * ldb, 23);
            std::vector<float> want(t * ldc, 7.0f), got = want;
            ChainReference(s, alpha, a.data(), lda, b.data(), ldb, 0.0f,
                           want.data(), ldc);
            cpu::GemmTriangularOn(*tile, cpu::GemmTriangle::kLowerOutput, ta,
                                  true, t, t, dh, alpha, a.data(), lda,
                                  b.data(), ldb, got.data(), ldc);
            for (int64_t i = 0; i < t; ++i)
              for (int64_t j = 0; j <= i; ++j)
                ASSERT_EQ(got[i * ldc + j], want[i * ldc + j])
                    << Describe(*tile, s, alpha, 0.0f) << " lower C at " << i
                    << "," << j;
          }
        }
      }
    }
  }
}

TEST(Gemm, TriangularProductsSkipWork) {
  // Not a timing: the skipped tiles leave C as it was, so a product that
  // skipped nothing would have overwritten every element.
  const int64_t t = 200, dh = 64;
  const std::vector<float> a = Random(t * dh, 24), b = Random(t * dh, 25);
  std::vector<float> c(t * t, 7.0f);
  cpu::GemmTriangular(cpu::GemmTriangle::kLowerOutput, false, true, t, t, dh,
                      1.0f, a.data(), dh, b.data(), dh, c.data(), t);
  int64_t untouched = 0;
  for (float x : c) untouched += x == 7.0f;
  // At least a third of the t^2 / 2 entries above the diagonal.
  EXPECT_GE(untouched, t * t / 6);
}

TEST(Gemm, BiasAddedAsCIsStoredIsTheSeparatePassBitwise) {
  // A Linear's forward: the product, then y += b on every row, in one go.
  // Edges in both dimensions, one to three passes of the depth, no depth.
  const Shape shapes[] = {
      {false, true, 1, 1, 1},      {false, true, 13, 33, 7},
      {false, false, 25, 70, 600}, {false, true, 40, 100, 800},
      {false, true, 300, 40, 90},  {false, false, 7, 9, 0},
      {false, true, 9, 48, 130}};
  for (const Shape& s : shapes) {
    const int64_t lda = s.k + 3, ldb = (s.tb ? s.k : s.n) + 5, ldc = s.n + 2;
    const std::vector<float> a = Random(s.m * lda, 30);
    const std::vector<float> b = Random((s.tb ? s.n : s.k) * ldb, 31);
    const std::vector<float> bias = Random(s.n, 32);
    std::vector<float> want(s.m * ldc, 7.0f);
    ChainReference(s, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, want.data(),
                   ldc);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) want[i * ldc + j] += bias[j];
    std::vector<float> got(s.m * ldc, 7.0f);
    cpu::GemmAddBias(s.tb, s.m, s.n, s.k, a.data(), lda, b.data(), ldb,
                     bias.data(), got.data(), ldc);
    ASSERT_EQ(got, want) << Describe(cpu::BestGemmTile(), s, 1.0f, 0.0f);
    cpu::PackedB packed;
    packed.Pack(s.tb, s.k, s.n, b.data(), ldb);
    std::vector<float> packed_got(s.m * ldc, 7.0f);
    cpu::GemmPackedBAddBias(s.m, a.data(), lda, packed, bias.data(),
                            packed_got.data(), ldc);
    ASSERT_EQ(packed_got, want)
        << "packed " << Describe(cpu::BestGemmTile(), s, 1.0f, 0.0f);
  }
}

TEST(Gemm, BPackedAheadGivesTheFusedChainOnEveryTile) {
  // A Linear's weight packed once a step (PackedB) for the products of its
  // forward (op(B) = W^T) and input gradient (op(B) = W).
  const Shape shapes[] = {
      {false, true, 1, 1, 1},       {false, false, 13, 33, 7},
      {false, true, 32, 70, 385},   {false, false, 5, 2100, 20},
      {false, true, 150, 70, 1000}, {false, false, 97, 64, 800}};
  const std::pair<float, float> scalings[] = {
      {1.0f, 0.0f}, {1.0f, 1.0f}, {0.5f, 2.0f}};
  for (const cpu::GemmTile* tile : cpu::SupportedGemmTiles()) {
    for (const Shape& s : shapes) {
      const int64_t lda = s.k + 3, ldb = (s.tb ? s.k : s.n) + 5, ldc = s.n + 2;
      const std::vector<float> a = Random(s.m * lda, 10);
      const std::vector<float> b = Random((s.tb ? s.n : s.k) * ldb, 11);
      const std::vector<float> c0 = Random(s.m * ldc, 12);
      cpu::PackedB packed;
      packed.PackOn(*tile, s.tb, s.k, s.n, b.data(), ldb);
      EXPECT_LE(packed.bytes(), cpu::PackedBBytesBound(s.k, s.n));
      for (auto [alpha, beta] : scalings) {
        std::vector<float> want = c0, got = c0;
        ChainReference(s, alpha, a.data(), lda, b.data(), ldb, beta,
                       want.data(), ldc);
        cpu::GemmPackedB(s.m, alpha, a.data(), lda, packed, beta, got.data(),
                         ldc);
        ASSERT_EQ(got, want) << Describe(*tile, s, alpha, beta);
      }
    }
  }
}

// B packed for products of few rows takes deeper passes on the tiles that
// have them (GemmTile::kc_few_rows): the bits are the chain's whatever the
// rows of the products that use it, few or many, and with or without a bias.
TEST(Gemm, BPackedForFewRowsGivesTheFusedChainForAnyRows) {
  for (const cpu::GemmTile* tile : cpu::SupportedGemmTiles()) {
    for (const int64_t k : {1, 385, 1100, 1500, 3000}) {
      const int64_t n = 70;
      cpu::PackedB few, any;
      const std::vector<float> b = Random(n * k, 20);
      few.PackOn(*tile, true, k, n, b.data(), k, /*rows=*/32);
      any.PackOn(*tile, true, k, n, b.data(), k);
      if (tile->kc_few_rows > 0 && k > tile->kc + tile->kc / 3) {
        EXPECT_GT(few.depth_block(), any.depth_block()) << tile->name << k;
      } else {
        EXPECT_EQ(few.depth_block(), any.depth_block()) << tile->name << k;
      }
      for (const int64_t m : {1, 12, 32, 48, 49, 100}) {
        const Shape s{false, true, m, n, k};
        const std::vector<float> a = Random(m * k, 21);
        std::vector<float> want(m * n, 0.0f);
        ChainReference(s, 1.0f, a.data(), k, b.data(), k, 0.0f, want.data(), n);
        std::vector<float> got(m * n, 7.0f), got_any(m * n, 7.0f);
        cpu::GemmPackedB(m, 1.0f, a.data(), k, few, 0.0f, got.data(), n);
        cpu::GemmPackedB(m, 1.0f, a.data(), k, any, 0.0f, got_any.data(), n);
        ASSERT_EQ(got, want) << "few " << Describe(*tile, s, 1.0f, 0.0f);
        ASSERT_EQ(got_any, want) << "any " << Describe(*tile, s, 1.0f, 0.0f);
        const std::vector<float> bias = Random(n, 22);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) want[i * n + j] += bias[j];
        cpu::GemmPackedBAddBias(m, a.data(), k, few, bias.data(), got.data(),
                                n);
        ASSERT_EQ(got, want) << "bias " << Describe(*tile, s, 1.0f, 0.0f);
      }
    }
  }
}

TEST(Gemm, BPackedAheadAgreesWithGemmOnTwoThreads) {
  const int64_t n = 1024, k = 784;
  const std::vector<float> w = Random(n * k, 13);
  cpu::PackedB packed;
  packed.Pack(true, k, n, w.data(), k);
  const int before = ComputeThreads();
  SetComputeThreads(2);
  for (int64_t m : {32, 256}) {
    const std::vector<float> a = Random(m * k, 14);
    std::vector<float> want(m * n), got(m * n);
    cpu::Gemm(false, true, m, n, k, 1.0f, a.data(), w.data(), 0.0f,
              want.data());
    cpu::GemmPackedB(m, 1.0f, a.data(), k, packed, 0.0f, got.data(), n);
    EXPECT_EQ(got, want) << "m=" << m;
  }
  SetComputeThreads(before);
}

TEST(Gemm, EachRowIsAFunctionOfItsRowAlone) {
  // Incremental decoding runs one row where the forward ran the sequence.
  const int64_t m = 97, n = 70, k = 500;
  const std::vector<float> a = Random(m * k, 4), w = Random(n * k, 5);
  std::vector<float> whole(m * n), row(n);
  cpu::GemmRowStable(m, n, k, a.data(), w.data(), whole.data());
  for (int64_t i = 0; i < m; ++i) {
    cpu::GemmRowStable(1, n, k, a.data() + i * k, w.data(), row.data());
    ASSERT_EQ(row, std::vector<float>(whole.begin() + i * n,
                                      whole.begin() + (i + 1) * n))
        << "row " << i;
  }
}

TEST(Gemm, TilesAtCsLastRowsWriteOnlyThem) {
  // The last rows of C run on C itself (GemmTile::run_rows) where a tile
  // can: the rows below C and the gap past each row keep their values.
  for (const cpu::GemmTile* tile : cpu::SupportedGemmTiles()) {
    for (int64_t m = 1; m <= 13; ++m) {
      for (float beta : {0.0f, 1.0f}) {
        const Shape s{false, false, m, 32, 20};
        const int64_t ldc = s.n + 3;
        const std::vector<float> a = Random(s.m * s.k, 40);
        const std::vector<float> b = Random(s.k * s.n, 41);
        std::vector<float> want = Random((s.m + 2) * ldc, 42), got = want;
        ChainReference(s, 1.0f, a.data(), s.k, b.data(), s.n, beta, want.data(),
                       ldc);
        cpu::GemmStridedOn(*tile, false, false, s.m, s.n, s.k, 1.0f, a.data(),
                           s.k, b.data(), s.n, beta, got.data(), ldc);
        ASSERT_EQ(got, want) << Describe(*tile, s, 1.0f, beta);
      }
    }
  }
}

TEST(Gemm, BetaZeroNeverReadsC) {
  const int64_t m = 30, n = 40, k = 50;
  const std::vector<float> a = Random(m * k, 6), b = Random(k * n, 7);
  std::vector<float> c(m * n, std::numeric_limits<float>::quiet_NaN());
  cpu::Gemm(false, false, m, n, k, 1.0f, a.data(), b.data(), 0.0f, c.data());
  for (float x : c) ASSERT_TRUE(std::isfinite(x));
  // With no depth, C is beta * C: zero for beta 0 whatever it held.
  std::vector<float> empty(m * n, std::numeric_limits<float>::quiet_NaN());
  cpu::Gemm(false, false, m, n, 0, 1.0f, a.data(), b.data(), 0.0f,
            empty.data());
  for (float x : empty) ASSERT_EQ(x, 0.0f);
}

TEST(Gemm, EveryTileAgreesAtTheSizesUsersTrain) {
  // A Linear of the width-1024 MLP on 2 threads, on each tile: the bits a
  // stage computes do not depend on the CPU generation it landed on.
  const int64_t m = 256, n = 1024, k = 784;
  const std::vector<float> a = Random(m * k, 8), w = Random(n * k, 9);
  const int before = ComputeThreads();
  SetComputeThreads(2);
  std::vector<std::vector<float>> out;
  for (const cpu::GemmTile* tile : cpu::SupportedGemmTiles()) {
    if (std::string(tile->name) == "portable") continue;  // ~1 GFLOP/s
    std::vector<float> y(m * n);
    cpu::GemmStridedOn(*tile, false, true, m, n, k, 1.0f, a.data(), k, w.data(),
                       k, 0.0f, y.data(), n);
    out.push_back(std::move(y));
  }
  SetComputeThreads(before);
  for (size_t t = 1; t < out.size(); ++t)
    EXPECT_EQ(out[t], out[0]) << cpu::SupportedGemmTiles()[t]->name;
  std::printf("tiles on this CPU:");
  for (const cpu::GemmTile* tile : cpu::SupportedGemmTiles())
    std::printf(" %s", tile->name);
  std::printf(" (Gemm uses %s)\n", cpu::GemmKernelName());
}

}  // namespace
}  // namespace gpipe
