// The tensor engine: storage sharing, the counting allocator, and CPU kernels
// against naive references.
#include "services/tensor/tensor.h"

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/tensor/allocator.h"
#include "services/tensor/cpu/conv.h"
#include "services/tensor/cpu/dropout_avx2.h"
#include "services/tensor/cpu/dropout_avx512.h"
#include "services/tensor/cpu/elementwise.h"
#include "services/tensor/cpu/gemm.h"
#include "services/tensor/cpu/layer_norm.h"
#include "services/tensor/cpu/pool.h"
#include "services/tensor/cpu/shallow_product.h"
#include "services/tensor/cpu/softmax.h"
#include "services/tensor/denormals.h"
#include "services/tensor/ops.h"
#include "services/tensor/threads.h"

namespace gpipe {
namespace {

std::vector<float> Random(int64_t n, uint64_t key) {
  std::vector<float> v(n);
  Rng rng(key);
  for (float& x : v) x = static_cast<float>(rng.Normal());
  return v;
}

TEST(Tensor, RowsAndReshapeShareStorage) {
  Tensor t = Tensor::FromVector({3, 2}, {0, 1, 2, 3, 4, 5});
  Tensor r = t.Rows(1, 3);
  EXPECT_EQ(r.shape(), Shape({2, 2}));
  EXPECT_EQ(r.f32()[0], 2.0f);
  r.f32()[0] = 9.0f;
  EXPECT_EQ(t.f32()[2], 9.0f);
  Tensor flat = t.Reshape({6});
  EXPECT_EQ(flat.f32()[2], 9.0f);
  Tensor copy = t.Clone();
  copy.f32()[0] = -1.0f;
  EXPECT_EQ(t.f32()[0], 0.0f);
  EXPECT_TRUE(BitwiseEqual(t, t.Clone()));
  EXPECT_FALSE(BitwiseEqual(t, copy));
}

TEST(CountingAllocator, CountsCurrentAndPeak) {
  CpuAllocator cpu;
  CountingAllocator counting(&cpu);
  {
    AllocatorScope scope(&counting);
    Tensor a = Tensor::Empty({256});  // 1 KiB
    EXPECT_EQ(counting.current_bytes(), 1024);
    {
      Tensor b = Tensor::Zeros({512});
      EXPECT_EQ(counting.current_bytes(), 3072);
    }
    EXPECT_EQ(counting.current_bytes(), 1024);
    EXPECT_EQ(counting.peak_bytes(), 3072);
    counting.ResetPeak();
    EXPECT_EQ(counting.peak_bytes(), 1024);
    Tensor view = a.Rows(0, 10);  // a view allocates nothing
    EXPECT_EQ(counting.current_bytes(), 1024);
  }
  EXPECT_EQ(counting.current_bytes(), 0);
  EXPECT_EQ(CurrentAllocator(), DefaultCpuAllocator());
}

TEST(Gemm, AllTransposesMatchNaive) {
  const int64_t m = 7, n = 5, k = 9;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> a = Random(m * k, 1), b = Random(k * n, 2);
      std::vector<float> c = Random(m * n, 3), want = c;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += double(ta ? a[p * m + i] : a[i * k + p]) *
                 (tb ? b[j * k + p] : b[p * n + j]);
          want[i * n + j] = static_cast<float>(0.5 * s + 2.0 * c[i * n + j]);
        }
      cpu::Gemm(ta, tb, m, n, k, 0.5f, a.data(), b.data(), 2.0f, c.data());
      for (int64_t i = 0; i < m * n; ++i)
        EXPECT_NEAR(c[i], want[i], 1e-4) << "ta=" << ta << " tb=" << tb;
    }
  }
}

TEST(Gemm, LongReductionMatchesNaive) {
  const int64_t m = 6, n = 5, k = 3000;  // eight passes over the depth
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      std::vector<float> a = Random(m * k, 11), b = Random(k * n, 12);
      std::vector<float> c = Random(m * n, 13), want = c;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t p = 0; p < k; ++p)
            s += double(ta ? a[p * m + i] : a[i * k + p]) *
                 (tb ? b[j * k + p] : b[p * n + j]);
          want[i * n + j] = static_cast<float>(s + c[i * n + j]);
        }
      cpu::Gemm(ta, tb, m, n, k, 1.0f, a.data(), b.data(), 1.0f, c.data());
      for (int64_t i = 0; i < m * n; ++i)
        EXPECT_NEAR(c[i], want[i], 2e-3) << "ta=" << ta << " tb=" << tb;
    }
  }
}

TEST(Conv, Im2ColGemmMatchesDirectConvolution) {
  const cpu::ConvGeometry g{2, 6, 5, 3, 2, 1};
  const int64_t cout = 3, oh = g.out_height(), ow = g.out_width();
  std::vector<float> x = Random(2 * 6 * 5, 4), w = Random(cout * 2 * 9, 5);
  std::vector<float> col(2 * 9 * oh * ow), y(cout * oh * ow);
  cpu::Im2Col(g, x.data(), col.data(), oh * ow);
  cpu::Gemm(false, false, cout, oh * ow, 18, 1.0f, w.data(), col.data(), 0.0f,
            y.data());
  for (int64_t o = 0; o < cout; ++o)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        double s = 0;
        for (int64_t c = 0; c < 2; ++c)
          for (int64_t ki = 0; ki < 3; ++ki)
            for (int64_t kj = 0; kj < 3; ++kj) {
              const int64_t yy = i * 2 - 1 + ki, xx = j * 2 - 1 + kj;
              if (yy < 0 || yy >= 6 || xx < 0 || xx >= 5) continue;
              s += double(w[((o * 2 + c) * 3 + ki) * 3 + kj]) *
                   x[(c * 6 + yy) * 5 + xx];
            }
        EXPECT_NEAR(y[(o * oh + i) * ow + j], s, 1e-4);
      }
}

// A first layer's product over its few taps runs outside the GEMM
// (shallow_product.h); every bit must be what the GEMM and the bias pass
// after it make, or the layer's output would depend on its depth.
TEST(Conv, ShallowProductIsTheGemmBitForBit) {
  for (const int64_t depth : {1, 9, 27, 32}) {
    for (const int64_t rows : {3, 16}) {
      // 100: vector bodies and a tail on every vector width.
      for (const int64_t n : {7, 100, 784}) {
        for (const bool with_bias : {false, true}) {
          SCOPED_TRACE(testing::Message()
                       << "depth " << depth << " rows " << rows << " n " << n
                       << " bias " << with_bias);
          const uint64_t key = static_cast<uint64_t>(depth * 1000 + n);
          // Rows of col and y further apart than n, and 4 floats of guard
          // past y's last row.
          const int64_t ldcol = n + 5, ldy = n + 3;
          std::vector<float> w = Random(rows * depth, key);
          std::vector<float> col = Random(depth * ldcol, key + 1);
          const std::vector<float> bias = Random(rows, key + 2);
          // A column of zeros, as im2col's padding leaves.
          for (int64_t t = 0; t < depth; ++t) col[t * ldcol] = 0.0f;
          std::vector<float> want(rows * ldy + 4, 1.0f), got = want;
          cpu::GemmStrided(false, false, rows, n, depth, 1.0f, w.data(), depth,
                           col.data(), ldcol, 0.0f, want.data(), ldy);
          if (with_bias)
            for (int64_t i = 0; i < rows; ++i)
              for (int64_t j = 0; j < n; ++j) want[i * ldy + j] += bias[i];
          ASSERT_TRUE(cpu::ShallowDepth(depth));
          cpu::ShallowProduct(rows, n, depth, w.data(), col.data(), ldcol,
                              with_bias ? bias.data() : nullptr, got.data(),
                              ldy);
          EXPECT_EQ(
              std::memcmp(got.data(), want.data(), want.size() * sizeof(float)),
              0);
        }
      }
    }
  }
}

// The first layer's weight gradient, accumulated sample by sample, likewise
// (where the CPU runs the direct kernel; elsewhere the GEMM runs anyway).
TEST(Conv, ShallowWeightGradientIsTheGemmBitForBit) {
  for (const int64_t depth : {1, 4, 9, 16}) {
    for (const int64_t channels : {1, 5, 16, 17, 32}) {
      for (const int64_t n : {7, 196}) {
        SCOPED_TRACE(testing::Message() << "depth " << depth << " channels "
                                        << channels << " n " << n);
        const uint64_t key = static_cast<uint64_t>(depth * 1000 + channels);
        const int64_t ld = n + 3;  // rows with a gap between them
        std::vector<float> col = Random(depth * ld, key);
        const std::vector<float> dy = Random(channels * ld, key + 1);
        for (int64_t t = 0; t < depth; ++t) col[t * ld] = 0.0f;  // padding
        // 16 floats of guard past the gradient: a store past it shows.
        std::vector<float> want = Random(depth * channels + 16, key + 2);
        std::vector<float> got = want;
        cpu::GemmStrided(false, true, depth, channels, n, 1.0f, col.data(), ld,
                         dy.data(), ld, 1.0f, want.data(), channels);
        if (!cpu::ShallowWeightGradient(depth, channels, n, col.data(),
                                        dy.data(), ld, got.data())) {
          GTEST_SKIP() << "no direct kernel on this CPU";
        }
        EXPECT_EQ(
            std::memcmp(got.data(), want.data(), want.size() * sizeof(float)),
            0);
      }
    }
  }
  EXPECT_FALSE(cpu::ShallowWeightGradient(cpu::kShallowGradientTaps + 1, 16, 7,
                                          nullptr, nullptr, 7, nullptr));
}

// A convolution's backward shares its work between threads three ways (a
// first layer's bias gradient beside its weight gradient; the samples'
// input gradients beside the weight gradient): every gradient must be the
// one thread's, bit for bit.
TEST(Conv, BackwardIsTheSameOnAnyThreadCount) {
  struct Case {
    cpu::ConvGeometry g;
    int64_t cout;
    bool input_gradient;
  };
  const Case cases[] = {{{1, 28, 28, 3, 1, 1}, 16, false},
                        {{3, 12, 12, 3, 1, 1}, 8, false},
                        {{4, 14, 14, 3, 1, 1}, 12, true},
                        {{2, 9, 9, 3, 2, 0}, 5, true}};
  const int before = ComputeThreads();
  const int64_t batch = 6;
  for (const Case& c : cases) {
    const int64_t in = batch * c.g.input_size(),
                  out = batch * c.cout * c.g.out_positions(),
                  wn = c.cout * c.g.column_rows();
    const std::vector<float> x = Random(in, 51), w = Random(wn, 52),
                             dy = Random(out, 53);
    std::vector<std::vector<float>> grads;
    for (int threads : {1, 2, 3}) {
      SetComputeThreads(threads);
      std::vector<float> dx(c.input_gradient ? in : 0);
      std::vector<float> dw = Random(wn, 54), db = Random(c.cout, 55);
      ops::Conv2dBackward(Device::kCpu, c.g, batch, c.cout, x.data(), w.data(),
                          dy.data(), c.input_gradient ? dx.data() : nullptr,
                          dw.data(), db.data());
      dw.insert(dw.end(), db.begin(), db.end());
      dw.insert(dw.end(), dx.begin(), dx.end());
      grads.push_back(std::move(dw));
    }
    for (size_t t = 1; t < grads.size(); ++t) {
      ASSERT_EQ(grads[t].size(), grads[0].size());
      EXPECT_EQ(std::memcmp(grads[t].data(), grads[0].data(),
                            grads[0].size() * sizeof(float)),
                0)
          << "channels " << c.g.channels << ", " << t + 1 << " threads";
    }
  }
  SetComputeThreads(before);
}

// Im2Col and Col2Im against their definitions, element by element, over
// strides, paddings wider than the kernel's reach and images narrower than
// it: the copies compute the inside range once per row, so its edges are
// what can go wrong. Col2Im must also add in the definition's order (the
// same bits).
TEST(Conv, Im2ColAndCol2ImMatchTheirDefinitions) {
  for (int64_t k : {1, 2, 3, 5})
    for (int64_t s : {1, 2, 3})
      for (int64_t p : {0, 1, 2, 4})
        for (int64_t w : {1, 4, 7}) {
          const cpu::ConvGeometry g{2, 5, w, k, s, p};
          if (g.out_height() < 1 || g.out_width() < 1) continue;
          const int64_t oh = g.out_height(), ow = g.out_width();
          const int64_t rows = 2 * k * k, ld = oh * ow + 3;
          std::vector<float> x = Random(2 * 5 * w, 11);
          std::vector<float> col(rows * ld, -7.0f);
          cpu::Im2Col(g, x.data(), col.data(), ld);
          std::vector<float> dcol = Random(rows * ld, 12);
          std::vector<float> dx = Random(2 * 5 * w, 13), want = dx;
          cpu::Col2Im(g, dcol.data(), ld, dx.data());
          for (int64_t c = 0; c < 2; ++c)
            for (int64_t ki = 0; ki < k; ++ki)
              for (int64_t kj = 0; kj < k; ++kj)
                for (int64_t i = 0; i < oh; ++i)
                  for (int64_t j = 0; j < ow; ++j) {
                    const int64_t r = (c * k + ki) * k + kj;
                    const int64_t yy = i * s - p + ki, xx = j * s - p + kj;
                    const bool in = yy >= 0 && yy < 5 && xx >= 0 && xx < w;
                    const float v = in ? x[(c * 5 + yy) * w + xx] : 0.0f;
                    ASSERT_EQ(col[r * ld + i * ow + j], v)
                        << "k=" << k << " s=" << s << " p=" << p << " w=" << w
                        << " row " << r << " at " << i << "," << j;
                    if (in)
                      want[(c * 5 + yy) * w + xx] += dcol[r * ld + i * ow + j];
                  }
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t e = oh * ow; e < ld; ++e)
              ASSERT_EQ(col[r * ld + e], -7.0f) << "wrote past its row";
          for (size_t e = 0; e < dx.size(); ++e)
            ASSERT_EQ(dx[e], want[e]) << "k=" << k << " s=" << s << " p=" << p
                                      << " w=" << w << " dx[" << e << "]";
        }
}

// Dropout's mask is UniformAt of each element's index, the GPU's too
// (cuda_kernels_test): the vectorized hash must keep every element of it.
TEST(Dropout, KeepsExactlyTheElementsUniformAtKeeps) {
  const int64_t n = 100003;  // vector bodies, a tail, and two threads' shares
  const std::vector<float> x = Random(n, 11);
  for (const float p : {0.1f, 0.5f}) {
    const uint64_t key = MixKey({42, static_cast<uint64_t>(p * 10)});
    std::vector<float> y(n), avx2(n, -1.0f), avx512(n, -1.0f);
    cpu::DropoutForward(n, p, key, x.data(), y.data());
    // The AVX2 and AVX-512 kernels wherever this CPU can run them,
    // whichever DropoutForward picks, in two ranges whose boundary is not a
    // vector's.
    const bool has_avx2 =
        cpu::DropoutRangeAvx2(0, 4099, p, key, x.data(), avx2.data()) &&
        cpu::DropoutRangeAvx2(4099, n, p, key, x.data(), avx2.data());
    const bool has_avx512 =
        cpu::DropoutRangeAvx512(0, 4099, p, key, x.data(), avx512.data()) &&
        cpu::DropoutRangeAvx512(4099, n, p, key, x.data(), avx512.data());
    const float scale = 1.0f / (1.0f - p);
    int64_t kept = 0, wrong = 0, wrong_avx2 = 0, wrong_avx512 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float want = UniformAt(key, i) >= p ? x[i] * scale : 0.0f;
      wrong += std::memcmp(&want, &y[i], sizeof(float)) != 0;
      wrong_avx2 += has_avx2 && std::memcmp(&want, &avx2[i], sizeof(float));
      wrong_avx512 +=
          has_avx512 && std::memcmp(&want, &avx512[i], sizeof(float));
      kept += y[i] != 0.0f;
    }
    EXPECT_EQ(wrong, 0) << "p " << p;
    EXPECT_EQ(wrong_avx2, 0) << "p " << p;
    EXPECT_EQ(wrong_avx512, 0) << "p " << p;
    EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.01) << "p " << p;
  }
}

// The 2 x 2, stride 2 windows have a loop of their own: it must pick the
// maximum and its index as the definition does, ties to the first in
// (row, column) order and a NaN never displacing a number before it.
TEST(MaxPool, TwoByTwoWindowsMatchTheDefinition) {
  const int64_t planes = 3, h = 6, w = 38;  // 19 outputs a row: a vector tail
  std::vector<float> x = Random(planes * h * w, 21);
  for (size_t i = 0; i < x.size(); i += 5) x[i] = 0.5f;  // ties
  x[7] = std::nanf("");
  x[w + 9] = std::nanf("");
  x[3 * w + 40] = -0.0f;
  x[3 * w + 41] = 0.0f;
  const int64_t oh = h / 2, ow = w / 2;
  std::vector<float> y(planes * oh * ow);
  std::vector<int32_t> argmax(y.size());
  cpu::MaxPool2dForward(planes, h, w, 2, 2, x.data(), y.data(), argmax.data());
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < oh; ++i)
      for (int64_t j = 0; j < ow; ++j) {
        const float* in = x.data() + p * h * w;
        int64_t best = 2 * i * w + 2 * j;
        for (int64_t ki = 0; ki < 2; ++ki)
          for (int64_t kj = 0; kj < 2; ++kj) {
            const int64_t at = (2 * i + ki) * w + 2 * j + kj;
            if (in[at] > in[best]) best = at;
          }
        const int64_t o = (p * oh + i) * ow + j;
        ASSERT_EQ(argmax[o], best) << "plane " << p << " at " << i << "," << j;
        ASSERT_EQ(std::memcmp(&y[o], &in[best], sizeof(float)), 0);
      }
}

TEST(Softmax, RowsSumToOne) {
  std::vector<float> x = Random(4 * 6, 6), y(24);
  x[0] = 80.0f;  // large logits must not overflow
  cpu::SoftmaxRows(4, 6, x.data(), y.data());
  for (int r = 0; r < 4; ++r) {
    double s = 0;
    for (int c = 0; c < 6; ++c) s += y[r * 6 + c];
    EXPECT_NEAR(s, 1.0, 1e-6);
  }
}

TEST(LayerNorm, NormalizesRows) {
  std::vector<float> x = Random(3 * 16, 7), y(48), mean(3), rstd(3);
  std::vector<float> gamma(16, 1.0f), beta(16, 0.0f);
  cpu::LayerNormForward(3, 16, 1e-5f, x.data(), gamma.data(), beta.data(),
                        y.data(), mean.data(), rstd.data());
  for (int r = 0; r < 3; ++r) {
    double s = 0, ss = 0;
    for (int c = 0; c < 16; ++c)
      s += y[r * 16 + c], ss += y[r * 16 + c] * y[r * 16 + c];
    EXPECT_NEAR(s / 16, 0.0, 1e-5);
    EXPECT_NEAR(ss / 16, 1.0, 1e-3);
  }
}

TEST(Threads, SettingThreadsSticksAfterAGemm) {
  // Nothing in a GEMM may take the OpenMP thread count down with it.
  const int before = ComputeThreads();
  SetComputeThreads(2);
  EXPECT_EQ(ComputeThreads(), 2);
  std::vector<float> a = Random(300 * 300, 1), c(300 * 300);
  cpu::Gemm(false, false, 300, 300, 300, 1.0f, a.data(), a.data(), 0.0f,
            c.data());
  EXPECT_EQ(ComputeThreads(), 2);
  SetComputeThreads(before);
}

TEST(Threads, GemmResultDoesNotDependOnThreadCount) {
  struct Case {
    bool ta, tb;
    int64_t m, n, k;
  };
  // Shapes of one block and of many in each dimension, fewer row blocks
  // than threads (the columns split too), long-K shapes (conv dW) and
  // edges everywhere.
  const Case cases[] = {
      {false, true, 256, 192, 300},   {false, false, 100, 700, 64},
      {true, false, 90, 60, 50},      {true, false, 256, 784, 1024},
      {true, true, 513, 129, 77},     {false, true, 16, 9, 100000},
      {false, false, 20, 30, 5000},   {false, true, 1024, 1024, 512},
      {false, false, 300, 2000, 1024}};
  const int before = ComputeThreads();
  for (const Case& c : cases) {
    std::vector<float> a = Random(c.m * c.k, 8), b = Random(c.k * c.n, 9);
    std::vector<std::vector<float>> out;
    for (int threads : {1, 2, 3}) {
      SetComputeThreads(threads);
      std::vector<float> y = Random(c.m * c.n, 10);
      cpu::Gemm(c.ta, c.tb, c.m, c.n, c.k, 1.0f, a.data(), b.data(), 1.0f,
                y.data());
      out.push_back(std::move(y));
    }
    EXPECT_EQ(out[0], out[1]) << c.m << "x" << c.n << "x" << c.k;
    EXPECT_EQ(out[0], out[2]) << c.m << "x" << c.n << "x" << c.k;
  }
  SetComputeThreads(before);
}

// A product of normal floats below the smallest normal one, and a denormal
// operand: both zero when the thread flushes them.
bool FlushesDenormals() {
  volatile float small = 1e-20f, denormal = 1e-39f;
  const float product = small * small;
  const float through = denormal * 1.0f;
  return product == 0.0f && through == 0.0f;
}

TEST(Threads, EveryThreadFlushesDenormals) {
#if !defined(__SSE2__) && !defined(__aarch64__)
  GTEST_SKIP() << "no flush-to-zero mode on this CPU";
#endif
  // The main thread (set before main), a thread made later without
  // SetComputeThreads (inherits it), and an OpenMP team.
  EXPECT_TRUE(DenormalsFlushedOnThisThread());
  EXPECT_TRUE(FlushesDenormals());
  bool in_thread = false;
  std::thread([&] {
    in_thread = DenormalsFlushedOnThisThread() && FlushesDenormals();
  }).join();
  EXPECT_TRUE(in_thread);
  const int before = ComputeThreads();
  SetComputeThreads(3);
  int flushed = 0;
#pragma omp parallel reduction(+ : flushed)
  flushed += DenormalsFlushedOnThisThread() && FlushesDenormals() ? 1 : 0;
  EXPECT_EQ(flushed, 3);
  SetComputeThreads(before);
}

TEST(TensorMemoryLimit, RefusesPastTheLimitOnItsThreadOnly) {
  const int64_t in_use = DefaultCpuAllocator()->current_bytes();
  {
    TensorMemoryLimit limit(in_use + (1 << 20));
    Tensor fits = Tensor::Empty(Shape{1 << 17});  // 512 KiB
    EXPECT_EQ(DefaultCpuAllocator()->current_bytes(), in_use + (1 << 19));
    try {
      Tensor at_limit = Tensor::Empty(Shape{1 << 17});  // exactly the limit
      Tensor more = Tensor::Empty(Shape{1});
      ADD_FAILURE() << "no TensorMemoryExhausted";
    } catch (const TensorMemoryExhausted& e) {
      EXPECT_EQ(e.requested(), 4);
      EXPECT_NE(std::string(e.what()).find("would exceed this worker's "
                                           "memory for stages, "),
                std::string::npos)
          << e.what();
    }
    // Another thread (a link's reader) is not limited, but counts.
    std::thread other([] { Tensor t = Tensor::Empty(Shape{1 << 18}); });
    other.join();
    // A stage's own counting allocator goes through the limited one.
    CountingAllocator stage(DefaultCpuAllocator());
    AllocatorScope scope(&stage);
    EXPECT_THROW(Tensor::Empty(Shape{1 << 18}), std::bad_alloc);
  }
  // Without a limit the same allocation succeeds.
  Tensor big = Tensor::Empty(Shape{1 << 18});
  EXPECT_EQ(DefaultCpuAllocator()->current_bytes(), in_use + (1 << 20));
}

}  // namespace
}  // namespace gpipe
