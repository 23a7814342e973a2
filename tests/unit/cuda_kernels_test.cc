// Every CUDA kernel against the CPU kernel on the same inputs. Kernels
// without transcendental functions must agree bitwise (same order of
// operations, no FMA contraction on either side); GELU, tanh, exp and log
// within a few float ulps (relative 1e-5); cuBLAS GEMM within fp32 rounding
// of a K-term dot product (relative 1e-4 of the row's magnitude).
// Skipped when no GPU is present.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/tensor/device.h"
#include "services/tensor/ops.h"
#include "services/tensor/tensor.h"
#include "tests/support/cuda_test_util.h"

namespace gpipe::cuda_test {
namespace {

class CudaKernelsTest : public CudaTest {};

void ExpectNear(const Tensor& cpu, const Tensor& gpu, double rel,
                const char* what) {
  EXPECT_LE(MaxRelError(cpu, gpu), rel) << what;
}

TEST_F(CudaKernelsTest, TensorRoundTripAndZero) {
  Tensor x = Random({37, 5}, 1);
  Tensor d = x.To(kCuda);
  EXPECT_EQ(d.device(), kCuda);
  EXPECT_TRUE(BitwiseEqual(d.To(kCpu), x));
  Tensor c = d.Clone();
  EXPECT_EQ(c.device(), kCuda);
  EXPECT_TRUE(BitwiseEqual(c, x));
  c.SetZero();
  for (float v : c.ToVector()) EXPECT_EQ(v, 0.0f);
  Tensor rows = d.Rows(3, 7).To(kCpu);
  EXPECT_TRUE(BitwiseEqual(rows, x.Rows(3, 7).Clone()));
}

TEST_F(CudaKernelsTest, GemmAllTranspositions) {
  const int64_t m = 67, n = 45, k = 129;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor a = Random(ta ? Shape{k, m} : Shape{m, k}, 2);
      Tensor b = Random(tb ? Shape{n, k} : Shape{k, n}, 3);
      Tensor c0 = Random({m, n}, 4);
      Tensor c = c0.Clone();
      ops::Gemm(kCpu, ta, tb, m, n, k, 0.5f, a.f32(), b.f32(), 1.0f, c.f32());
      Tensor da = a.To(kCuda), db = b.To(kCuda), dc = c0.To(kCuda);
      ops::Gemm(kCuda, ta, tb, m, n, k, 0.5f, da.f32(), db.f32(), 1.0f,
                dc.f32());
      ExpectNear(c, dc, 1e-4, ta ? (tb ? "TT" : "TN") : (tb ? "NT" : "NN"));
    }
  }
}

// x rounded to bf16, to nearest even (finite inputs), as the GPU rounds.
float RoundBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof(u));
  return x;
}

// bf16 compute rounds the two operands and nothing else: the GPU's product
// of fp32 inputs equals the CPU's fp32 product of the rounded inputs within
// fp32 rounding (products of bf16 values are exact in fp32), and is not the
// fp32 product of the unrounded ones.
TEST_F(CudaKernelsTest, GemmBf16RoundsOnlyTheOperands) {
  if (!RealGpu()) GTEST_SKIP() << "the fake device computes GEMMs in fp32";
  const int64_t m = 67, n = 45, k = 129;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(ta ? (tb ? "TT" : "TN") : (tb ? "NT" : "NN"));
      Tensor a = Random(ta ? Shape{k, m} : Shape{m, k}, 2);
      Tensor b = Random(tb ? Shape{n, k} : Shape{k, n}, 3);
      Tensor a16 = a.Clone(), b16 = b.Clone();
      for (int64_t i = 0; i < a.numel(); ++i)
        a16.f32()[i] = RoundBf16(a.f32()[i]);
      for (int64_t i = 0; i < b.numel(); ++i)
        b16.f32()[i] = RoundBf16(b.f32()[i]);
      Tensor c0 = Random({m, n}, 4);
      Tensor rounded = c0.Clone(), exact = c0.Clone();
      ops::Gemm(kCpu, ta, tb, m, n, k, 0.5f, a16.f32(), b16.f32(), 1.0f,
                rounded.f32());
      ops::Gemm(kCpu, ta, tb, m, n, k, 0.5f, a.f32(), b.f32(), 1.0f,
                exact.f32());
      Tensor da = a.To(kCuda), db = b.To(kCuda), dc = c0.To(kCuda);
      {
        ops::GemmPrecisionScope bf16(ops::GemmPrecision::kBf16);
        EXPECT_EQ(ops::CurrentGemmPrecision(), ops::GemmPrecision::kBf16);
        ops::Gemm(kCuda, ta, tb, m, n, k, 0.5f, da.f32(), db.f32(), 1.0f,
                  dc.f32());
      }
      ExpectNear(rounded, dc, 1e-4, "against the rounded operands");
      const std::vector<float> e = exact.ToVector(), g = dc.ToVector();
      double worst = 0;
      for (size_t i = 0; i < e.size(); ++i)
        worst = std::max<double>(worst, std::fabs(e[i] - g[i]));
      EXPECT_GT(worst, 1e-3) << "bf16 was not used";
    }
  }
}

// Runs everywhere: scopes nest and restore, and the CPU computes in fp32
// whatever the scope says.
TEST(GemmPrecisionTest, ScopesNestAndTheCpuStaysFp32) {
  const ops::GemmPrecision outer = ops::CurrentGemmPrecision();
  {
    ops::GemmPrecisionScope bf16(ops::GemmPrecision::kBf16);
    EXPECT_EQ(ops::CurrentGemmPrecision(), ops::GemmPrecision::kBf16);
    {
      ops::GemmPrecisionScope f32(ops::GemmPrecision::kF32);
      EXPECT_EQ(ops::CurrentGemmPrecision(), ops::GemmPrecision::kF32);
    }
    EXPECT_EQ(ops::CurrentGemmPrecision(), ops::GemmPrecision::kBf16);
  }
  EXPECT_EQ(ops::CurrentGemmPrecision(), outer);
  Tensor a = Random({9, 13}, 1), b = Random({13, 7}, 2);
  Tensor c1 = Tensor::Zeros({9, 7}), c2 = Tensor::Zeros({9, 7});
  ops::Gemm(kCpu, false, false, 9, 7, 13, 1.0f, a.f32(), b.f32(), 0.0f,
            c1.f32());
  ops::GemmPrecisionScope bf16(ops::GemmPrecision::kBf16);
  ops::Gemm(kCpu, false, false, 9, 7, 13, 1.0f, a.f32(), b.f32(), 0.0f,
            c2.f32());
  EXPECT_TRUE(BitwiseEqual(c1, c2));
}

TEST_F(CudaKernelsTest, ElementwiseBitwise) {
  const int64_t rows = 300, cols = 77, n = rows * cols;
  Tensor a = Random({rows, cols}, 5), b = Random({rows, cols}, 6);
  Tensor bias = Random({cols}, 7);
  Tensor da = a.To(kCuda), db = b.To(kCuda), dbias = bias.To(kCuda);
  Tensor out = Tensor::Empty(a.shape()), dout = out.To(kCuda);
  ops::Add(kCpu, n, a.f32(), b.f32(), out.f32());
  ops::Add(kCuda, n, da.f32(), db.f32(), dout.f32());
  EXPECT_TRUE(BitwiseEqual(out, dout));
  ops::AddRowBias(kCpu, rows, cols, bias.f32(), out.f32());
  ops::AddRowBias(kCuda, rows, cols, dbias.f32(), dout.f32());
  EXPECT_TRUE(BitwiseEqual(out, dout));
  ops::AddInPlace(kCpu, n, a.f32(), out.f32());
  ops::AddInPlace(kCuda, n, da.f32(), dout.f32());
  EXPECT_TRUE(BitwiseEqual(out, dout));
  ops::Scale(kCpu, n, 0.37f, out.f32());
  ops::Scale(kCuda, n, 0.37f, dout.f32());
  EXPECT_TRUE(BitwiseEqual(out, dout));
  ops::ReluForward(kCpu, n, a.f32(), out.f32());
  ops::ReluForward(kCuda, n, da.f32(), dout.f32());
  EXPECT_TRUE(BitwiseEqual(out, dout));
  Tensor g = Tensor::Empty(a.shape()), dg = g.To(kCuda);
  ops::ReluBackward(kCpu, n, out.f32(), b.f32(), g.f32());
  ops::ReluBackward(kCuda, n, dout.f32(), db.f32(), dg.f32());
  EXPECT_TRUE(BitwiseEqual(g, dg));
  Tensor sums = Random({cols}, 8), dsums = sums.To(kCuda);
  ops::SumRowsInto(kCpu, rows, cols, a.f32(), sums.f32());
  ops::SumRowsInto(kCuda, rows, cols, da.f32(), dsums.f32());
  EXPECT_TRUE(BitwiseEqual(sums, dsums));
}

TEST_F(CudaKernelsTest, DropoutSameMasksAsCpu) {
  const int64_t n = 100'003;
  Tensor x = Random({n}, 9), dx = x.To(kCuda);
  for (float p : {0.1f, 0.5f}) {
    const uint64_t key = MixKey({42, static_cast<uint64_t>(p * 100)});
    Tensor y = Tensor::Empty({n}), dy = y.To(kCuda);
    ops::DropoutForward(kCpu, n, p, key, x.f32(), y.f32());
    ops::DropoutForward(kCuda, n, p, key, dx.f32(), dy.f32());
    EXPECT_TRUE(BitwiseEqual(y, dy)) << "p=" << p;
    ops::DropoutBackward(kCpu, n, p, key, x.f32(), y.f32());
    ops::DropoutBackward(kCuda, n, p, key, dx.f32(), dy.f32());
    EXPECT_TRUE(BitwiseEqual(y, dy)) << "p=" << p;
  }
}

TEST_F(CudaKernelsTest, TranscendentalActivations) {
  const int64_t n = 50'000;
  Tensor x = Random({n}, 10, 3.0f), g = Random({n}, 11);
  Tensor dx = x.To(kCuda), dg = g.To(kCuda);
  Tensor y = Tensor::Empty({n}), dy = y.To(kCuda);
  ops::GeluForward(kCpu, n, x.f32(), y.f32());
  ops::GeluForward(kCuda, n, dx.f32(), dy.f32());
  ExpectNear(y, dy, 1e-5, "gelu forward");
  ops::GeluBackward(kCpu, n, x.f32(), g.f32(), y.f32());
  ops::GeluBackward(kCuda, n, dx.f32(), dg.f32(), dy.f32());
  ExpectNear(y, dy, 1e-5, "gelu backward");
  ops::TanhForward(kCpu, n, x.f32(), y.f32());
  ops::TanhForward(kCuda, n, dx.f32(), dy.f32());
  ExpectNear(y, dy, 1e-5, "tanh forward");
  Tensor t = y.Clone(), dt = dy.Clone();
  ops::TanhBackward(kCpu, n, t.f32(), g.f32(), y.f32());
  ops::TanhBackward(kCuda, n, dt.f32(), dg.f32(), dy.f32());
  ExpectNear(y, dy, 1e-5, "tanh backward");
}

TEST_F(CudaKernelsTest, SoftmaxCrossEntropy) {
  const int64_t rows = 513, classes = 10;
  Tensor logits = Random({rows, classes}, 12, 4.0f);
  std::vector<int32_t> t(rows);
  for (int64_t r = 0; r < rows; ++r) t[r] = r % 7 == 3 ? -1 : r % classes;
  Tensor targets = Tensor::FromInts({rows}, t);
  Tensor d = Tensor::Empty(logits.shape());
  Tensor dd = d.To(kCuda), dlogits = logits.To(kCuda);
  Tensor dtargets = targets.To(kCuda);
  const cpu::CrossEntropyResult a = ops::SoftmaxCrossEntropy(
      kCpu, rows, classes, logits.f32(), targets.i32(), 600.0, d.f32());
  const cpu::CrossEntropyResult b = ops::SoftmaxCrossEntropy(
      kCuda, rows, classes, dlogits.f32(), dtargets.i32(), 600.0, dd.f32());
  EXPECT_EQ(a.counted, b.counted);
  EXPECT_EQ(a.correct, b.correct);
  EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-5 * a.loss_sum);
  ExpectNear(d, dd, 1e-6, "dlogits");
}

// A warp per row: vocabulary-wide rows, rows with fewer classes than a
// warp's lanes, and ties for the largest logit, which the CPU gives to the
// first column.
TEST_F(CudaKernelsTest, SoftmaxCrossEntropyWideRowsAndTies) {
  for (int64_t classes : {int64_t{3}, int64_t{33}, int64_t{5000}}) {
    SCOPED_TRACE(classes);
    const int64_t rows = 67;
    Tensor logits = Random({rows, classes}, 21, 4.0f);
    std::vector<float> z = logits.ToVector();
    for (int64_t r = 0; r < rows; r += 3) {  // a tie between two columns
      float* row = z.data() + r * classes;
      const int64_t a = r % classes, b = (r * 7 + 1) % classes;
      row[a] = row[b] = 20.0f;
    }
    logits = Tensor::FromVector({rows, classes}, z);
    std::vector<int32_t> t(rows);
    for (int64_t r = 0; r < rows; ++r)
      t[r] = r % 11 == 5 ? -1 : static_cast<int32_t>((r * 7 + 1) % classes);
    Tensor targets = Tensor::FromInts({rows}, t);
    Tensor d = Tensor::Empty(logits.shape());
    Tensor dd = d.To(kCuda);
    const cpu::CrossEntropyResult a = ops::SoftmaxCrossEntropy(
        kCpu, rows, classes, logits.f32(), targets.i32(), 100.0, d.f32());
    const cpu::CrossEntropyResult b =
        ops::SoftmaxCrossEntropy(kCuda, rows, classes, logits.To(kCuda).f32(),
                                 targets.To(kCuda).i32(), 100.0, dd.f32());
    EXPECT_EQ(a.counted, b.counted);
    EXPECT_EQ(a.correct, b.correct);
    EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-5 * a.loss_sum);
    ExpectNear(d, dd, 1e-5, "dlogits");
  }
}

// Tokens land in every bucket of the GPU's scatter and many repeat, so a
// table row adds several tokens' rows: bitwise the CPU's order.
TEST_F(CudaKernelsTest, EmbeddingScatterIsTheCpusOrder) {
  const int64_t n = 700, dim = 48, vocab = 97;
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i)
    ids[i] = static_cast<int32_t>((i * i + 3 * i) % vocab);
  Tensor tokens = Tensor::FromInts({n}, ids);
  Tensor dout = Random({n, dim}, 22);
  Tensor table = Random({vocab, dim}, 23), gtable = table.To(kCuda);
  Tensor position = Tensor::Zeros({n, dim}), gposition = position.To(kCuda);
  ops::EmbeddingBackward(kCpu, 1, n, dim, tokens.i32(), dout.f32(), table.f32(),
                         position.f32());
  ops::EmbeddingBackward(kCuda, 1, n, dim, tokens.To(kCuda).i32(),
                         dout.To(kCuda).f32(), gtable.f32(), gposition.f32());
  EXPECT_TRUE(BitwiseEqual(table, gtable));
  EXPECT_TRUE(BitwiseEqual(position, gposition));
}

TEST_F(CudaKernelsTest, LayerNorm) {
  const int64_t rows = 129, cols = 96;
  Tensor x = Random({rows, cols}, 13, 2.0f), dy = Random({rows, cols}, 14);
  Tensor gamma = Random({cols}, 15), beta = Random({cols}, 16);
  Tensor y = Tensor::Empty(x.shape()), mean = Tensor::Empty({rows}),
         rstd = Tensor::Empty({rows}), dx = Tensor::Empty(x.shape());
  Tensor dgamma = Tensor::Zeros({cols}), dbeta = Tensor::Zeros({cols});
  Tensor gx = x.To(kCuda), gdy = dy.To(kCuda), ggamma = gamma.To(kCuda),
         gbeta = beta.To(kCuda), gy = y.To(kCuda), gmean = mean.To(kCuda),
         grstd = rstd.To(kCuda), gdx = dx.To(kCuda), gdgamma = dgamma.To(kCuda),
         gdbeta = dbeta.To(kCuda);
  ops::LayerNormForward(kCpu, rows, cols, 1e-5f, x.f32(), gamma.f32(),
                        beta.f32(), y.f32(), mean.f32(), rstd.f32());
  ops::LayerNormForward(kCuda, rows, cols, 1e-5f, gx.f32(), ggamma.f32(),
                        gbeta.f32(), gy.f32(), gmean.f32(), grstd.f32());
  ExpectNear(y, gy, 1e-5, "layer norm y");
  ops::LayerNormBackward(kCpu, rows, cols, x.f32(), mean.f32(), rstd.f32(),
                         gamma.f32(), dy.f32(), dx.f32(), dgamma.f32(),
                         dbeta.f32());
  ops::LayerNormBackward(kCuda, rows, cols, gx.f32(), gmean.f32(), grstd.f32(),
                         ggamma.f32(), gdy.f32(), gdx.f32(), gdgamma.f32(),
                         gdbeta.f32());
  ExpectNear(dx, gdx, 1e-5, "layer norm dx");
  ExpectNear(dgamma, gdgamma, 1e-5, "dgamma");
  EXPECT_TRUE(BitwiseEqual(dbeta, gdbeta));
}

TEST_F(CudaKernelsTest, SumSquaresIsReproducible) {
  const int64_t n = 1'000'001;
  Tensor x = Random({n}, 17), dx = x.To(kCuda);
  const double cpu = ops::SumSquares(kCpu, n, x.f32());
  const double gpu = ops::SumSquares(kCuda, n, dx.f32());
  EXPECT_NEAR(cpu, gpu, 1e-9 * cpu);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(gpu, ops::SumSquares(kCuda, n, dx.f32()));  // bitwise
}

}  // namespace
}  // namespace gpipe::cuda_test
