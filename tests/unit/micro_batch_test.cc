// Micro-batch accumulation: M micro-batches give the mini-batch gradient (to
// fp32 rounding), and the same M twice is bitwise the same run.
#include "services/pipeline/micro_batch.h"

#include <cmath>

#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/reference_trainer.h"
#include "services/tensor/threads.h"

namespace gpipe {
namespace {

constexpr char kSpec[] = R"json({
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [12]}},
    "layers": [
      {"linear": {"inFeatures": 12, "outFeatures": 32}},
      {"gelu": {}},
      {"layerNorm": {"features": 32}},
      {"dropout": {"p": 0.0}},
      {"linear": {"inFeatures": 32, "outFeatures": 16}},
      {"tanh": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 4}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "adamw": {}, "clipNorm": 0.5},
  "data": {"synthetic": {"task": "CLASSES", "features": 12, "classes": 4,
                         "trainSamples": 512, "testSamples": 64}},
  "batchSize": 30,
  "steps": 5,
  "seed": 3
})json";

std::unique_ptr<ReferenceTrainer> Train(int64_t micro_batches, int steps) {
  absl::StatusOr<gpipe::v1::JobSpec> spec = ParseJobSpecJson(kSpec);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto trainer = ReferenceTrainer::Create(*spec, micro_batches);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  for (int i = 0; i < steps; ++i) {
    auto r = (*trainer)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
  }
  return std::move(*trainer);
}

TEST(SplitMicroBatches, SizesDifferByAtMostOne) {
  const std::vector<RowRange> r = SplitMicroBatches(10, 4);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].begin, 0);
  EXPECT_EQ(r[0].end - r[0].begin, 3);
  EXPECT_EQ(r[1].end - r[1].begin, 3);
  EXPECT_EQ(r[2].end - r[2].begin, 2);
  EXPECT_EQ(r[3].end, 10);
  for (int64_t n = 1; n <= 40; ++n)
    for (int64_t m = 1; m <= n; ++m) {
      const std::vector<RowRange> s = SplitMicroBatches(n, m);
      int64_t lo = n, hi = 0, at = 0;
      for (const RowRange& x : s) {
        EXPECT_EQ(x.begin, at);
        at = x.end;
        lo = std::min(lo, x.end - x.begin);
        hi = std::max(hi, x.end - x.begin);
      }
      EXPECT_EQ(at, n);
      EXPECT_LE(hi - lo, 1);
      EXPECT_GE(lo, 1);
    }
}

TEST(MicroBatchAccumulation, OneAndFourAgreeToRounding) {
  auto one = Train(1, 1);
  auto four = Train(4, 1);  // 30 rows: 8, 8, 7, 7
  const auto& a = one->model().Parameters();
  const auto& b = four->model().Parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor& x = a[i].param->value;
    const Tensor& y = b[i].param->value;
    double diff = 0, norm = 0;
    for (int64_t j = 0; j < x.numel(); ++j) {
      diff = std::max(diff, std::fabs(double(x.f32()[j]) - y.f32()[j]));
      norm = std::max(norm, std::fabs(double(x.f32()[j])));
    }
    EXPECT_LE(diff, 1e-5 * std::max(1.0, norm)) << a[i].name;
  }
}

TEST(MicroBatchAccumulation, SameMTwiceIsBitwiseEqual) {
  auto first = Train(4, 5);
  auto second = Train(4, 5);
  const auto& a = first->model().Parameters();
  const auto& b = second->model().Parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(BitwiseEqual(a[i].param->value, b[i].param->value))
        << a[i].name;
}

TEST(MicroBatchAccumulation, ThreadCountDoesNotChangeTheResult) {
  const int before = ComputeThreads();
  SetComputeThreads(1);
  auto one = Train(4, 3);
  SetComputeThreads(2);
  auto two = Train(4, 3);
  SetComputeThreads(before);
  const auto& a = one->model().Parameters();
  const auto& b = two->model().Parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(BitwiseEqual(a[i].param->value, b[i].param->value))
        << a[i].name;
}

// Each step after the first takes the batch gathered while the step before
// ran; the bits are the gathered batch's (SameMTwiceIsBitwiseEqual, and
// pipeline_exactness_test against the stages, which gather their own).
TEST(MicroBatchAccumulation, TheNextBatchIsGatheredAhead) {
  std::unique_ptr<ReferenceTrainer> trainer = Train(2, 4);
  ASSERT_NE(trainer, nullptr);
  EXPECT_EQ(trainer->batches_taken_ahead(), 3);
}

TEST(MicroBatchAccumulation, MoreMicroBatchesThanRowsIsAnError) {
  absl::StatusOr<gpipe::v1::JobSpec> spec = ParseJobSpecJson(kSpec);
  ASSERT_TRUE(spec.ok());
  auto trainer = ReferenceTrainer::Create(*spec, 31);
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("larger than batch_size 30"),
            std::string::npos)
      << trainer.status();
}

}  // namespace
}  // namespace gpipe
