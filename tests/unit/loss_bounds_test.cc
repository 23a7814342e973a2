// Targets outside the head's classes never reach memory the logits do not
// own: the cross-entropy kernel counts them (no loss, no gradient) and the
// caller refuses them with an error naming the class count; -1 is still an
// ignored row. Token ids outside an embedding's vocabulary are refused the
// same way before its forward (which clamps them, never reading outside
// its table).
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/nn/layers/embedding.h"
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

TEST(LossBoundsTest, TokenIdsOutsideTheVocabularyAreRefused) {
  Embedding embedding(/*vocab_size=*/5, /*dim=*/4, /*max_positions=*/3);
  embedding.Initialize(1);
  Tensor ids = Tensor::FromInts(Shape({2, 3}), {0, 4, 2, 1, 3, 4});
  EXPECT_TRUE(embedding.CheckInput(ids).ok());
  ids.i32()[1] = 5;
  ids.i32()[4] = -2;
  const absl::Status s = embedding.CheckInput(ids);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(),
              ::testing::HasSubstr("2 token id(s) are outside the embedding's "
                                   "vocabulary of 5 (the first: 5)"));
  // The forward still reads only inside its table.
  LayerContext ctx;
  const Tensor y = embedding.Forward(ids, ctx, nullptr);
  EXPECT_EQ(y.numel(), 2 * 3 * 4);
}

}  // namespace
}  // namespace gpipe
