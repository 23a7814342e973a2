// Targets outside the head's classes never reach memory the logits do not
// own: the cross-entropy kernel counts them (no loss, no gradient) and the
// caller refuses them with an error naming the class count; -1 is still an
// ignored row.
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/nn/loss.h"

namespace gpipe {
namespace {

TEST(LossBoundsTest, TargetsOutsideTheClassesAreCountedNotRead) {
  const int64_t rows = 4, classes = 3;
  Tensor logits = Tensor::Empty(Shape({rows, classes}));
  for (int64_t i = 0; i < logits.numel(); ++i) logits.f32()[i] = 0.1f * i;
  Tensor targets = Tensor::Empty(Shape({rows}), DType::kI32);
  const std::vector<int32_t> t = {1, 3, -1, -7};  // ok, too big, ignored, bad
  for (int64_t i = 0; i < rows; ++i) targets.i32()[i] = t[i];
  Tensor dlogits;
  const LossResult r = SoftmaxCrossEntropyLoss(logits, targets, 1.0, &dlogits);
  EXPECT_EQ(r.counted, 1);
  EXPECT_EQ(r.out_of_range, 2);
  for (int64_t row : {1, 2, 3}) {
    for (int64_t c = 0; c < classes; ++c) {
      EXPECT_EQ(dlogits.f32()[row * classes + c], 0.0f) << row;
    }
  }
  const absl::Status s = CheckTargetsInRange(r, classes);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("outside the 3 classes"));

  for (int64_t i = 0; i < rows; ++i) targets.i32()[i] = i % classes;
  const LossResult ok = SoftmaxCrossEntropyLoss(logits, targets, 1.0, nullptr);
  EXPECT_EQ(ok.out_of_range, 0);
  EXPECT_TRUE(CheckTargetsInRange(ok, classes).ok());
}

}  // namespace
}  // namespace gpipe
