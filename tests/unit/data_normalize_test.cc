// data.normalize: one pair for the sample, one per channel, one per
// feature; the arithmetic a user repeats in PyTorch; and bad settings named.
#include <cfloat>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/normalize.h"
#include "services/tensor/denormals.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

// Every input element is its flat index within the batch.
class Counting final : public Dataset {
 public:
  explicit Counting(Shape sample, DType dtype = DType::kF32)
      : sample_(std::move(sample)), dtype_(dtype) {}
  int64_t size(Split) const override { return 4; }
  Shape input_shape() const override { return sample_; }
  DType input_dtype() const override { return dtype_; }
  Shape target_shape() const override { return Shape(); }
  int64_t num_classes() const override { return 2; }
  Batch Gather(Split, const std::vector<int64_t>& indices) const override {
    const int64_t b = static_cast<int64_t>(indices.size());
    Batch batch{Tensor::Empty(sample_.WithBatch(b), DType::kF32),
                Tensor::Empty(Shape{b}, DType::kI32)};
    for (int64_t i = 0; i < batch.inputs.numel(); ++i) {
      batch.inputs.f32()[i] = static_cast<float>(i);
    }
    for (int64_t i = 0; i < b; ++i) batch.targets.i32()[i] = 1;
    return batch;
  }

 private:
  Shape sample_;
  DType dtype_;
};

gpipe::v1::Normalize Pairs(std::vector<float> mean, std::vector<float> std) {
  gpipe::v1::Normalize n;
  n.mutable_mean()->Assign(mean.begin(), mean.end());
  n.mutable_std()->Assign(std.begin(), std.end());
  return n;
}

TEST(NormalizeTest, OnePairMapsEveryElement) {
  auto data =
      Normalized(std::make_unique<Counting>(Shape{3}), Pairs({0.5f}, {0.25f}));
  ASSERT_TRUE(data.ok()) << data.status();
  const Batch b = (*data)->Gather(Split::kTrain, {0, 1});
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_EQ(b.inputs.f32()[i], (static_cast<float>(i) - 0.5f) / 0.25f);
  }
  EXPECT_EQ(b.targets.i32()[1], 1);
}

TEST(NormalizeTest, PerChannelGroupsTheFirstDimension) {
  // [2, 1, 2]: channel 0 holds elements 0-1 of each sample, channel 1 2-3.
  auto data = Normalized(std::make_unique<Counting>(Shape{2, 1, 2}),
                         Pairs({0, 10}, {1, 2}));
  ASSERT_TRUE(data.ok()) << data.status();
  const Batch b = (*data)->Gather(Split::kTrain, {0, 1});
  const std::vector<float> want = {0, 1, (2 - 10) / 2.f, (3 - 10) / 2.f,
                                   4, 5, (6 - 10) / 2.f, (7 - 10) / 2.f};
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(b.inputs.f32()[i], want[i]) << i;
}

TEST(NormalizeTest, PerFeature) {
  auto data = Normalized(std::make_unique<Counting>(Shape{3}),
                         Pairs({1, 2, 3}, {1, 2, 4}));
  ASSERT_TRUE(data.ok()) << data.status();
  const Batch b = (*data)->Gather(Split::kTest, {2, 3});
  const std::vector<float> want = {-1, -0.5f, -0.25f, 2, 1, 0.5f};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(b.inputs.f32()[i], want[i]) << i;
}

TEST(NormalizeTest, BadSettingsAreNamed) {
  const auto fails = [](Shape shape, gpipe::v1::Normalize n,
                        DType dtype = DType::kF32) {
    return CheckNormalize(n, shape, dtype);
  };
  EXPECT_THAT(fails(Shape{3}, Pairs({}, {})).message(),
              HasSubstr("mean: required"));
  EXPECT_THAT(fails(Shape{3}, Pairs({1, 2}, {1})).message(),
              HasSubstr("std: has 1 values, mean has 2"));
  EXPECT_THAT(fails(Shape{4, 5}, Pairs({1, 2}, {1, 1})).message(),
              HasSubstr("takes 1 (the whole sample), 4 (its first dimension) "
                        "or 20 (each element)"));
  EXPECT_THAT(fails(Shape{2}, Pairs({1, 2}, {1, 0})).message(),
              HasSubstr("std[1]: must be positive"));
  EXPECT_THAT(fails(Shape{2}, Pairs({NAN}, {1})).message(),
              HasSubstr("mean[0]: must be finite"));
  EXPECT_THAT(fails(Shape{2}, Pairs({0}, {1}), DType::kI32).message(),
              HasSubstr("applies to FLOAT32 inputs; the data gives int32"));
  EXPECT_FALSE(Normalized(std::make_unique<Counting>(Shape{2}, DType::kI32),
                          Pairs({0}, {1}))
                   .ok());
}

// A subnormal std reads as 0 on a compute thread (denormals are zero there):
// it is refused by its own value, not as "got 0".
TEST(NormalizeTest, ASubnormalStdIsNamedAsSuch) {
  absl::Status status;
  std::thread([&] {
    FlushDenormalsOnThisThread();
    status = CheckNormalize(Pairs({0}, {1e-45f}), Shape{2}, DType::kF32);
  }).join();
  EXPECT_THAT(status.message(), HasSubstr("std[0]: 1.4"));
  EXPECT_THAT(status.message(),
              HasSubstr("is below the smallest normal float (1.17549e-38)"));
  EXPECT_TRUE(
      CheckNormalize(Pairs({0}, {FLT_MIN}), Shape{2}, DType::kF32).ok());
}

}  // namespace
}  // namespace gpipe
