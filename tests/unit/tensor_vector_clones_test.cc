// The CPU kernels compiled three times (services/tensor/cpu/vector_clones.h:
// AVX-512 and AVX2 clones and the x86-64 baseline, chosen by the loader)
// give the bits of the same formula computed one element at a time,
// whichever clone runs on this CPU, the loops' remainders included. Together
// with the baseline build's own tests this is what lets a job's stages run on
// CPUs with and without AVX2 or AVX-512 and still match the reference bitwise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/tensor/cpu/elementwise.h"
#include "services/tensor/cpu/layer_norm.h"
#include "services/tensor/cpu/loss_blocks.h"
#include "services/tensor/cpu/normal.h"
#include "services/tensor/cpu/optimizer.h"
#include "services/tensor/cpu/reduce.h"
#include "services/tensor/cpu/softmax.h"
#include "services/tensor/cpu/softmax_row.h"
#include "services/tensor/cpu/table_exp.h"
#include "services/tensor/cpu/tanh.h"
#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {
namespace {

// Lengths around the vector widths (4, 8, 16) and the lanes' remainder.
constexpr int64_t kLengths[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 256, 1031};

std::vector<float> Random(int64_t n, uint64_t seed, float scale = 3.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v)
    x = (static_cast<float>(rng.Uniform()) * 2.0f - 1.0f) * scale;
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(VectorClonesTest, TheCpuIsReported) {
#if defined(__x86_64__)
  RecordProperty("avx2", __builtin_cpu_supports("avx2") ? "yes" : "no");
  RecordProperty("avx512f", __builtin_cpu_supports("avx512f") ? "yes" : "no");
#endif
  SUCCEED();
}

// The references below are plain loops in this file, built for the
// baseline and not vectorized.
#define SCALAR __attribute__((optimize("no-tree-vectorize")))

SCALAR std::vector<float> GeluRef(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * Normal(x[i]).cdf;
  return y;
}

SCALAR std::vector<float> GeluGradRef(const std::vector<float>& x,
                                      const std::vector<float>& dy) {
  std::vector<float> dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const NormalAt v = Normal(x[i]);
    dx[i] = dy[i] * (v.cdf + x[i] * v.pdf);
  }
  return dx;
}

SCALAR std::vector<float> TanhRef(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = Tanh(x[i]);
  return y;
}

TEST(VectorClonesTest, ElementwiseKernelsGiveTheScalarBits) {
  for (int64_t n : kLengths) {
    const std::vector<float> a = Random(n, 1), b = Random(n, 2);
    std::vector<float> got(n), want(n);
    Add(n, a.data(), b.data(), got.data());
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] + b[i];
    EXPECT_TRUE(SameBits(got, want)) << "Add " << n;
    got = b;
    Axpy(n, 0.37f, a.data(), got.data());
    for (int64_t i = 0; i < n; ++i) want[i] = b[i] + 0.37f * a[i];
    EXPECT_TRUE(SameBits(got, want)) << "Axpy " << n;
    ReluForward(n, a.data(), got.data());
    for (int64_t i = 0; i < n; ++i) want[i] = a[i] > 0.0f ? a[i] : 0.0f;
    EXPECT_TRUE(SameBits(got, want)) << "Relu " << n;
    GeluForward(n, a.data(), got.data());
    EXPECT_TRUE(SameBits(got, GeluRef(a))) << "GeluForward " << n;
    GeluBackward(n, a.data(), b.data(), got.data());
    EXPECT_TRUE(SameBits(got, GeluGradRef(a, b))) << "GeluBackward " << n;
    TanhForward(n, a.data(), got.data());
    EXPECT_TRUE(SameBits(got, TanhRef(a))) << "TanhForward " << n;
  }
}

// The cross-entropy kernel's formula one element at a time: blocks of 256
// logits, each one's exps against the largest logit so far, the sum so far
// scaled down when a block raises it; the sum in lane j % 32; the gradient
// of block b scaled by exp(its shift - the row's) / sum.
SCALAR float CrossEntropyRef(int64_t classes, const float* z, int32_t t,
                             float* d, bool* correct) {
  float lanes[kLossLanes] = {};
  float shift = -std::numeric_limits<float>::max();
  std::vector<float> shifts;
  float best = z[0];
  int64_t arg = 0;
  for (int64_t c = 1; c < classes; ++c)
    if (z[c] > best) best = z[c], arg = c;
  for (int64_t start = 0; start < classes; start += 256) {
    const int64_t end = std::min<int64_t>(classes, start + 256);
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t c = start; c < end; ++c) m = z[c] > m ? z[c] : m;
    if (m > shift) {
      for (float& l : lanes) l *= TableExp(shift - m);
      shift = m;
    }
    shifts.push_back(shift);
    for (int64_t c = start; c < end; ++c) {
      d[c] = TableExp(z[c] - shift);
      lanes[c % kLossLanes] += d[c];
    }
  }
  const float s = AddLossLanes(lanes);
  const float inv = 1.0f / s;
  for (int64_t c = 0; c < classes; ++c)
    d[c] *= TableExp(shifts[c / 256] - shift) * inv * 0.5f;
  d[t] -= 0.5f;
  *correct = arg == t;
  return std::log(s) - (z[t] - shift);
}

TEST(VectorClonesTest, CrossEntropyGivesTheScalarBits) {
  for (int64_t n : kLengths) {
    std::vector<float> z = Random(n, 12, 8.0f);
    z[n / 2] = 9.0f;  // the largest twice: the first is taken
    z[n - 1] = z[n / 2];
    if (n > 600) z[600] = 12.0f;  // a later block raises the shift
    const int32_t t = static_cast<int32_t>(n - 1);
    std::vector<float> got(n), want(n);
    const CrossEntropyResult r =
        SoftmaxCrossEntropy(1, n, z.data(), &t, 2.0, got.data());
    bool correct = false;
    const float loss = CrossEntropyRef(n, z.data(), t, want.data(), &correct);
    EXPECT_TRUE(SameBits(got, want)) << "dlogits " << n;
    EXPECT_EQ(r.loss_sum, static_cast<double>(loss)) << n;
    EXPECT_EQ(r.correct, correct ? 1 : 0) << n;
    EXPECT_EQ(r.correct, n / 2 == n - 1 && n <= 600 ? 1 : 0) << n;
  }
}

// The first column of the largest logit, as a scan from the first with `>`
// finds it (a NaN is never larger; a NaN first one stays).
int64_t ScanArgMax(int64_t n, const float* x) {
  float best = x[0];
  int64_t arg = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > best) best = x[i], arg = i;
  return arg;
}

TEST(VectorClonesTest, ArgMaxIsTheScansFirstLargest) {
  const float nan = std::nanf("");
  for (int64_t n : {1, 3, 8, 31, 32, 33, 63, 64, 65, 100, 1031, 4099}) {
    for (int pattern = 0; pattern < 7; ++pattern) {
      std::vector<float> z = Random(n, 40 + pattern, 5.0f);
      const int64_t a = n / 3, b = n - 1;
      switch (pattern) {
        case 1:  // the largest twice, in different blocks or the tail
          z[a] = z[b] = 9.0f;
          break;
        case 2:  // twice in one vector
          z[a] = 9.0f;
          if (a + 1 < n) z[a + 1] = 9.0f;
          break;
        case 3:  // a NaN first: it is the answer
          z[0] = nan;
          break;
        case 4:  // NaNs later are skipped
          z[a] = nan;
          z[b] = nan;
          break;
        case 5:  // the largest is zero, of both signs
          for (float& x : z) x = -std::fabs(x) - 1.0f;
          z[a] = -0.0f;
          z[b] = 0.0f;
          break;
        case 6:  // all equal
          for (float& x : z) x = 2.0f;
          break;
      }
      // The kernel's clone for this CPU counts the scan's answer as
      // correct, and its neighbour as not.
      const int64_t want = ScanArgMax(n, z.data());
      const int32_t t = static_cast<int32_t>(want);
      const CrossEntropyResult r =
          SoftmaxCrossEntropy(1, n, z.data(), &t, 1.0, nullptr);
      EXPECT_EQ(r.correct, 1) << n << " pattern " << pattern;
      if (n > 1) {
        const int32_t other = static_cast<int32_t>((want + 1) % n);
        EXPECT_EQ(
            SoftmaxCrossEntropy(1, n, z.data(), &other, 1.0, nullptr).correct,
            0)
            << n << " pattern " << pattern;
      }
    }
  }
}

SCALAR void AdamWRef(int64_t n, const float* g, float* w, float* m, float* v) {
  for (int64_t j = 0; j < n; ++j) {
    w[j] *= 0.999f;
    m[j] = 0.9f * m[j] + (1.0f - 0.9f) * g[j];
    v[j] = 0.95f * v[j] + (1.0f - 0.95f) * g[j] * g[j];
    w[j] -= 0.01f * m[j] / (std::sqrt(v[j]) / 0.7f + 1e-8f);
  }
}

TEST(VectorClonesTest, OptimizerStepsGiveTheScalarBits) {
  for (int64_t n : kLengths) {
    const std::vector<float> g = Random(n, 3);
    std::vector<float> w = Random(n, 4), m = Random(n, 5, 0.1f);
    std::vector<float> v = Random(n, 6, 0.1f);
    for (float& x : v) x = std::fabs(x);
    std::vector<float> w2 = w, m2 = m, v2 = v;
    AdamWStep(n, 0.999f, 0.9f, 0.95f, 0.01f, 0.7f, 1e-8f, g.data(), w.data(),
              m.data(), v.data());
    AdamWRef(n, g.data(), w2.data(), m2.data(), v2.data());
    EXPECT_TRUE(SameBits(w, w2) && SameBits(m, m2) && SameBits(v, v2))
        << "AdamW " << n;
    std::vector<float> sw = Random(n, 7), buf = Random(n, 8);
    std::vector<float> sw2 = sw, buf2 = buf;
    SgdStep(n, 0.1f, 0.01f, 0.9f, /*nesterov=*/true, /*first=*/false, g.data(),
            sw.data(), buf.data());
    for (int64_t j = 0; j < n; ++j) {
      const float d = g[j] + 0.01f * sw2[j];
      buf2[j] = 0.9f * buf2[j] + d;
      sw2[j] -= 0.1f * (d + 0.9f * buf2[j]);
    }
    EXPECT_TRUE(SameBits(sw, sw2) && SameBits(buf, buf2)) << "Sgd " << n;
  }
}

TEST(VectorClonesTest, LayerNormGivesTheLaneFormulaBitsAndIsAccurate) {
  for (int64_t cols : kLengths) {
    const int64_t rows = 5;
    // A large mean against a small spread: the two-pass variance keeps it.
    std::vector<float> x = Random(rows * cols, 9);
    for (float& v : x) v += 1000.0f;
    const std::vector<float> gamma = Random(cols, 10), beta = Random(cols, 11);
    std::vector<float> y(rows * cols), mean(rows), rstd(rows);
    LayerNormForward(rows, cols, 1e-5f, x.data(), gamma.data(), beta.data(),
                     y.data(), mean.data(), rstd.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float* in = x.data() + r * cols;
      const float m = LaneSum(cols, in) / cols;
      const float s =
          1.0f /
          std::sqrt(LaneSumSquaredDeviations(cols, in, m) / cols + 1e-5f);
      ASSERT_EQ(mean[r], m);
      ASSERT_EQ(rstd[r], s);
      double dm = 0.0, dv = 0.0;
      for (int64_t c = 0; c < cols; ++c) dm += in[c];
      dm /= cols;
      for (int64_t c = 0; c < cols; ++c) dv += (in[c] - dm) * (in[c] - dm);
      dv /= cols;
      const double ds = 1.0 / std::sqrt(dv + 1e-5);
      for (int64_t c = 0; c < cols; ++c) {
        const float want = (in[c] - m) * s * gamma[c] + beta[c];
        ASSERT_EQ(y[r * cols + c], want) << cols << " " << c;
        EXPECT_NEAR(y[r * cols + c], (in[c] - dm) * ds * gamma[c] + beta[c],
                    2e-3)
            << cols;
      }
    }
  }
}

TEST(VectorClonesTest, SoftmaxGivesTheRowFormulaBitsAndKeepsNaN) {
  for (int64_t cols : kLengths) {
    const int64_t rows = 4;
    std::vector<float> x = Random(rows * cols, 12, 30.0f);
    x[0] = -1000.0f;  // its exp is below every float: 0
    std::vector<float> y(rows * cols), want(rows * cols);
    SoftmaxRows(rows, cols, x.data(), y.data());
    for (int64_t r = 0; r < rows; ++r)
      SoftmaxRow(cols, x.data() + r * cols, want.data() + r * cols);
    EXPECT_TRUE(SameBits(y, want)) << cols;
    for (int64_t r = 0; r < rows; ++r) {
      const float* in = x.data() + r * cols;
      double mx = in[0], sum = 0.0;
      for (int64_t c = 0; c < cols; ++c) mx = std::max<double>(mx, in[c]);
      for (int64_t c = 0; c < cols; ++c) sum += std::exp(in[c] - mx);
      for (int64_t c = 0; c < cols; ++c) {
        const double p = std::exp(in[c] - mx) / sum;
        EXPECT_NEAR(y[r * cols + c], p, 4e-6 * p + 1e-37) << cols << " " << c;
      }
    }
    if (cols > 1) {
      EXPECT_EQ(y[0], 0.0f);
    }
    const std::vector<float> dy = Random(rows * cols, 13);
    std::vector<float> dx(rows * cols), dx_want(rows * cols);
    SoftmaxRowsBackward(rows, cols, y.data(), dy.data(), dx.data());
    for (int64_t r = 0; r < rows; ++r) {
      const float* yr = y.data() + r * cols;
      const float* dyr = dy.data() + r * cols;
      const float dot = LaneDot(cols, yr, dyr);
      for (int64_t c = 0; c < cols; ++c)
        dx_want[r * cols + c] = yr[c] * (dyr[c] - dot);
    }
    EXPECT_TRUE(SameBits(dx, dx_want)) << "backward " << cols;
    // A NaN score makes its row NaN, not a finite distribution.
    std::vector<float> bad = Random(cols, 14);
    bad[cols / 2] = NAN;
    std::vector<float> out(cols);
    SoftmaxRows(1, cols, bad.data(), out.data());
    for (float p : out) EXPECT_TRUE(std::isnan(p)) << cols;
  }
}

TEST(VectorClonesTest, SumRowsAddsEachColumnInRowOrder) {
  const int64_t rows = 37, cols = 1031;
  const std::vector<float> x = Random(rows * cols, 15);
  std::vector<float> got = Random(cols, 16), want = got;
  SumRowsInto(rows, cols, x.data(), got.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) want[c] += x[r * cols + c];
  EXPECT_TRUE(SameBits(got, want));
}

}  // namespace
}  // namespace gpipe::cpu
