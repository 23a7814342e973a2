// The softmax cross-entropy kernel (services/tensor/cpu/softmax.cc): close
// to a double-precision reference at a classifier's and a language model's
// widths, ties to the first column, ignored rows, non-finite logits; and
// the loss without a gradient is the same bits as with one.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/tensor/cpu/softmax.h"

namespace gpipe::cpu {
namespace {

std::vector<float> Logits(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = (static_cast<float>(rng.Uniform()) - 0.5f) * 16.0f;
  return v;
}

TEST(CrossEntropyTest, IsCloseToTheDoublePrecisionLoss) {
  for (int64_t classes : {1, 3, 10, 33, 1031, 32000}) {
    SCOPED_TRACE(classes);
    const int64_t rows = 7;
    const std::vector<float> z = Logits(rows * classes, 1 + classes);
    std::vector<int32_t> t(rows);
    for (int64_t r = 0; r < rows; ++r)
      t[r] = r == 2 ? -1 : static_cast<int32_t>((r * 13 + 5) % classes);
    std::vector<float> d(z.size());
    const CrossEntropyResult got =
        SoftmaxCrossEntropy(rows, classes, z.data(), t.data(), 4.0, d.data());
    double loss = 0;
    int64_t correct = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = z.data() + r * classes;
      double m = row[0];
      int64_t arg = 0;
      for (int64_t c = 1; c < classes; ++c)
        if (row[c] > m) m = row[c], arg = c;
      double s = 0;
      for (int64_t c = 0; c < classes; ++c) s += std::exp(row[c] - m);
      for (int64_t c = 0; c < classes; ++c) {
        double want = t[r] < 0 ? 0.0 : std::exp(row[c] - m) / s / 4.0;
        if (c == t[r]) want -= 0.25;
        ASSERT_NEAR(d[r * classes + c], want, 2e-7 + 2e-6 * std::fabs(want))
            << r << "," << c;
      }
      if (t[r] < 0) continue;
      loss += std::log(s) - (row[t[r]] - m);
      correct += arg == t[r];
    }
    EXPECT_EQ(got.counted, rows - 1);
    EXPECT_EQ(got.correct, correct);
    EXPECT_NEAR(got.loss_sum, loss, 1e-6 * loss + 1e-6);
    // Evaluation: no gradient, the same loss bits.
    const CrossEntropyResult eval =
        SoftmaxCrossEntropy(rows, classes, z.data(), t.data(), 4.0, nullptr);
    EXPECT_EQ(eval.loss_sum, got.loss_sum);
    EXPECT_EQ(eval.correct, got.correct);
  }
}

// The kernel reads a row once, its exps against the largest logit so far
// (softmax.cc's OnlineExps): rows whose largest comes late (every block
// rescales what came before), whose first blocks hold only -inf or far
// smaller logits (exp of their shift underflows), and ties between blocks.
TEST(CrossEntropyTest, RowsReadOnceMatchTheDoubleLossWhereverTheirLargestIs) {
  const int64_t classes = 1500;  // 5 full blocks of 256 and a partial one
  std::vector<std::vector<float>> rows;
  std::vector<float> rising(classes);
  for (int64_t c = 0; c < classes; ++c) rising[c] = 0.01f * c - 5.0f;
  rows.push_back(rising);
  std::vector<float> late_inf = Logits(classes, 9);
  for (int64_t c = 0; c < 600; ++c)
    late_inf[c] = -std::numeric_limits<float>::infinity();
  rows.push_back(late_inf);
  std::vector<float> far = Logits(classes, 10);
  for (int64_t c = 0; c < 512; ++c) far[c] -= 200.0f;
  far[1400] = 60.0f;
  rows.push_back(far);
  std::vector<float> ties = Logits(classes, 11);
  ties[300] = ties[700] = ties[1499] = 9.0f;
  rows.push_back(ties);
  for (size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(i);
    const std::vector<float>& z = rows[i];
    double m = -std::numeric_limits<double>::infinity();
    int64_t arg = 0;
    for (int64_t c = 0; c < classes; ++c)
      if (z[c] > m) m = z[c], arg = c;
    double s = 0;
    for (int64_t c = 0; c < classes; ++c) s += std::exp(z[c] - m);
    for (const int32_t t : {static_cast<int32_t>(arg), int32_t{700}}) {
      std::vector<float> d(classes);
      const CrossEntropyResult got =
          SoftmaxCrossEntropy(1, classes, z.data(), &t, 2.0, d.data());
      EXPECT_NEAR(got.loss_sum, std::log(s) - (z[t] - m), 2e-6);
      EXPECT_EQ(got.correct, t == arg ? 1 : 0) << "target " << t;
      for (int64_t c = 0; c < classes; ++c) {
        double want = std::exp(z[c] - m) / s / 2.0;
        if (c == t) want -= 0.5;
        ASSERT_NEAR(d[c], want, 2e-7 + 2e-6 * std::fabs(want)) << c;
      }
    }
  }
}

TEST(CrossEntropyTest, TiesGoToTheFirstColumnAndNonFiniteLogitsShow) {
  const int64_t classes = 37;
  std::vector<float> z(3 * classes, 0.0f);
  z[5] = z[29] = 3.0f;  // row 0: a tie; the target is the second one
  z[classes + 11] = std::numeric_limits<float>::quiet_NaN();
  for (int64_t c = 0; c < classes; ++c)
    z[2 * classes + c] = -std::numeric_limits<float>::infinity();
  std::vector<int32_t> t = {29, 0, 0};
  CrossEntropyResult r =
      SoftmaxCrossEntropy(1, classes, z.data(), t.data(), 1.0, nullptr);
  EXPECT_EQ(r.correct, 0);
  t[0] = 5;
  r = SoftmaxCrossEntropy(1, classes, z.data(), t.data(), 1.0, nullptr);
  EXPECT_EQ(r.correct, 1);
  // A NaN logit, or a row of nothing but -inf: the loss is not finite, so
  // the trainers' check stops the job.
  std::vector<float> d(z.size());
  r = SoftmaxCrossEntropy(1, classes, z.data() + classes, t.data() + 1, 1.0,
                          d.data());
  EXPECT_TRUE(std::isnan(r.loss_sum));
  r = SoftmaxCrossEntropy(1, classes, z.data() + 2 * classes, t.data() + 2, 1.0,
                          nullptr);
  EXPECT_FALSE(std::isfinite(r.loss_sum));
}

}  // namespace
}  // namespace gpipe::cpu
