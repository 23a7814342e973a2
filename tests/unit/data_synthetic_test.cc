// Synthetic tasks: COPY/REVERSE targets and their ignore mask, Gaussian
// clusters, determinism, and the errors OpenDataset gives for bad specs.
#include <cmath>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/dataset.h"
#include "services/data/synthetic.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

gpipe::v1::DataSpec SequenceSpec(gpipe::v1::SyntheticTask task, int64_t vocab,
                                 int64_t length) {
  gpipe::v1::DataSpec spec;
  auto* s = spec.mutable_synthetic();
  s->set_task(task);
  s->set_vocab_size(vocab);
  s->set_length(length);
  s->set_train_samples(1000000000);
  s->set_test_samples(1000);
  return spec;
}

std::unique_ptr<Dataset> Open(const gpipe::v1::DataSpec& spec,
                              uint64_t seed = 1) {
  auto d = OpenDataset(spec, Shape(), seed);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

void CheckSequenceBatch(const Batch& b, int64_t vocab, int64_t length,
                        bool reverse) {
  const int64_t t_len = 2 * length;
  ASSERT_EQ(b.inputs.shape().rank(), 2);
  ASSERT_EQ(b.inputs.dim(1), t_len);
  ASSERT_EQ(b.targets.shape(), b.inputs.shape());
  ASSERT_EQ(b.inputs.dtype(), DType::kI32);
  ASSERT_EQ(b.targets.dtype(), DType::kI32);
  for (int64_t i = 0; i < b.inputs.dim(0); ++i) {
    const int32_t* x = b.inputs.i32() + i * t_len;
    const int32_t* y = b.targets.i32() + i * t_len;
    for (int64_t t = 0; t < length; ++t) {
      ASSERT_GE(x[t], 0);
      ASSERT_LT(x[t], vocab);
      // Nothing to predict inside x, nor the separator.
      ASSERT_EQ(y[t], -1) << t;
    }
    ASSERT_EQ(x[length], vocab);  // the separator
    for (int64_t k = 0; k < length; ++k) {
      const int32_t want = reverse ? x[length - 1 - k] : x[k];
      // Position length + k predicts y[k] ...
      ASSERT_EQ(y[length + k], want) << k;
      // ... and the model reads y[k] one position later (teacher forcing).
      if (k + 1 < length) {
        ASSERT_EQ(x[length + 1 + k], want) << k;
      }
    }
  }
}

TEST(SyntheticCopy, TargetsAndMask) {
  auto d = Open(SequenceSpec(gpipe::v1::COPY, 8, 5));
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->num_classes(), 9);
  EXPECT_EQ(d->input_shape(), (Shape{10}));
  EXPECT_EQ(d->target_shape(), (Shape{10}));
  EXPECT_EQ(d->input_dtype(), DType::kI32);
  EXPECT_EQ(d->size(Split::kTrain), 1000000000);
  EXPECT_EQ(d->size(Split::kTest), 1000);
  CheckSequenceBatch(d->Gather(Split::kTrain, {0, 1, 2, 999999999}), 8, 5,
                     false);
  CheckSequenceBatch(d->Gather(Split::kTest, {0, 999}), 8, 5, false);
}

TEST(SyntheticReverse, TargetsAndMask) {
  auto d = Open(SequenceSpec(gpipe::v1::REVERSE, 3, 7));
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->num_classes(), 4);
  std::vector<int64_t> idx(64);
  for (int i = 0; i < 64; ++i) idx[i] = i * 7919;
  CheckSequenceBatch(d->Gather(Split::kTrain, idx), 3, 7, true);
}

TEST(SyntheticReverse, ExplicitSequence) {
  SequenceTask task(SequenceTask::Kind::kReverse, 10, 3, 5, 5, 123);
  const std::vector<int32_t> s = task.Sequence(Split::kTrain, 2);
  ASSERT_EQ(s.size(), 7u);
  EXPECT_EQ(s[3], 10);
  EXPECT_EQ(s[4], s[2]);
  EXPECT_EQ(s[5], s[1]);
  EXPECT_EQ(s[6], s[0]);
  Batch b = task.Gather(Split::kTrain, {2});
  EXPECT_THAT(std::vector<int32_t>(b.inputs.i32(), b.inputs.i32() + 6),
              ::testing::ElementsAre(s[0], s[1], s[2], 10, s[2], s[1]));
  EXPECT_THAT(std::vector<int32_t>(b.targets.i32(), b.targets.i32() + 6),
              ::testing::ElementsAre(-1, -1, -1, s[2], s[1], s[0]));
}

TEST(Synthetic, DeterministicPerSeedSplitAndIndex) {
  auto spec = SequenceSpec(gpipe::v1::COPY, 50, 20);
  auto a = Open(spec, 7), b = Open(spec, 7), c = Open(spec, 8);
  const std::vector<int64_t> idx = {5, 6};
  Batch a_train = a->Gather(Split::kTrain, idx);
  EXPECT_TRUE(
      BitwiseEqual(a_train.inputs, b->Gather(Split::kTrain, idx).inputs));
  EXPECT_TRUE(
      BitwiseEqual(a_train.targets, b->Gather(Split::kTrain, idx).targets));
  EXPECT_FALSE(
      BitwiseEqual(a_train.inputs, c->Gather(Split::kTrain, idx).inputs));
  EXPECT_FALSE(
      BitwiseEqual(a_train.inputs, a->Gather(Split::kTest, idx).inputs));
  // A sample does not depend on which batch it is gathered in.
  Batch one = a->Gather(Split::kTrain, {6});
  EXPECT_TRUE(BitwiseEqual(one.inputs, a_train.inputs.Rows(1, 2)));
  // Different indices give different sequences.
  EXPECT_FALSE(BitwiseEqual(a_train.inputs.Rows(0, 1), one.inputs));
}

TEST(Synthetic, SymbolsCoverTheVocabulary) {
  auto d = Open(SequenceSpec(gpipe::v1::COPY, 6, 10));
  std::vector<int64_t> idx(100);
  for (int i = 0; i < 100; ++i) idx[i] = i;
  Batch b = d->Gather(Split::kTrain, idx);
  std::set<int32_t> seen;
  for (int i = 0; i < 100; ++i) {
    for (int t = 0; t < 10; ++t) seen.insert(b.inputs.i32()[i * 20 + t]);
  }
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(SyntheticClasses, ShapesLabelsAndClusters) {
  gpipe::v1::DataSpec spec;
  auto* s = spec.mutable_synthetic();
  s->set_task(gpipe::v1::CLASSES);
  s->set_features(16);
  s->set_classes(4);
  s->set_train_samples(2000);
  s->set_test_samples(500);
  auto opened = OpenDataset(spec, Shape{16}, 3);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto* d = dynamic_cast<GaussianClasses*>(opened->get());
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->num_classes(), 4);
  EXPECT_EQ(d->input_shape(), (Shape{16}));
  EXPECT_EQ(d->target_shape(), Shape());
  EXPECT_EQ(d->input_dtype(), DType::kF32);

  std::vector<int64_t> idx(2000);
  for (int i = 0; i < 2000; ++i) idx[i] = i;
  Batch b = d->Gather(Split::kTrain, idx);
  EXPECT_EQ(b.inputs.shape(), (Shape{2000, 16}));
  EXPECT_EQ(b.targets.shape(), (Shape{2000}));
  std::vector<int> counts(4);
  std::vector<double> sum(4 * 16), sq(4);
  int nearest_right = 0;
  for (int i = 0; i < 2000; ++i) {
    const int32_t label = b.targets.i32()[i];
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 4);
    ++counts[label];
    const float* x = b.inputs.f32() + i * 16;
    int best = -1;
    double best_dist = 1e30;
    for (int c = 0; c < 4; ++c) {
      double dist = 0;
      for (int f = 0; f < 16; ++f) {
        dist += std::pow(x[f] - d->center(c)[f], 2);
      }
      if (dist < best_dist) best_dist = dist, best = c;
      if (c == label) sq[c] += dist;
    }
    nearest_right += best == label;
    for (int f = 0; f < 16; ++f) sum[label * 16 + f] += x[f];
  }
  // Labels are uniform; noise has std 0.5 around the center.
  for (int c = 0; c < 4; ++c) {
    EXPECT_NEAR(counts[c], 500, 100);
    for (int f = 0; f < 16; ++f) {
      EXPECT_NEAR(sum[c * 16 + f] / counts[c], d->center(c)[f], 0.15);
    }
    EXPECT_NEAR(sq[c] / counts[c] / 16, 0.25, 0.03);
  }
  EXPECT_GT(nearest_right, 1900);
  // Train and test share the centers but not the samples.
  Batch t = d->Gather(Split::kTest, {0});
  EXPECT_FALSE(BitwiseEqual(t.inputs, b.inputs.Rows(0, 1)));
}

void ExpectSpecError(const gpipe::v1::DataSpec& spec, const char* field) {
  auto d = OpenDataset(spec, Shape(), 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument)
      << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr(field));
}

// A split small enough is drawn once and copied from; a larger one is
// drawn on every gather. The same samples either way, bit for bit.
TEST(SyntheticClasses, DrawingOnceGivesTheSameSamples) {
  const int64_t features = 7, classes = 3;
  const GaussianClasses once(features, classes, 200, 50, 11);
  const int64_t big = GaussianClasses::kDrawnOnceFloats / features + 1;
  const GaussianClasses every(features, classes, big, big, 11);
  const std::vector<int64_t> indices = {0, 5, 199, 5, 42};
  for (Split split : {Split::kTrain, Split::kTest}) {
    const std::vector<int64_t> in_range =
        split == Split::kTrain ? indices : std::vector<int64_t>{49, 0, 7};
    const Batch a = once.Gather(split, in_range);
    const Batch b = every.Gather(split, in_range);
    const Batch again = once.Gather(split, in_range);
    EXPECT_TRUE(BitwiseEqual(a.inputs, b.inputs));
    EXPECT_TRUE(BitwiseEqual(a.targets, b.targets));
    EXPECT_TRUE(BitwiseEqual(a.inputs, again.inputs));
  }
}

// A test split left out (0) is a tenth of the training samples, at least
// one, as job validation lets it through: workers used to refuse it.
TEST(SyntheticSpec, TestSamplesLeftOutDefaultToATenth) {
  for (const auto& [train, test] :
       {std::pair<int64_t, int64_t>{1000, 100}, {95, 9}, {3, 1}}) {
    auto spec = SequenceSpec(gpipe::v1::COPY, 4, 4);
    spec.mutable_synthetic()->set_train_samples(train);
    spec.mutable_synthetic()->clear_test_samples();
    auto d = OpenDataset(spec, Shape(), 0);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ((*d)->size(Split::kTrain), train);
    EXPECT_EQ((*d)->size(Split::kTest), test);
  }
}

TEST(SyntheticSpec, ErrorsNameTheField) {
  ExpectSpecError(gpipe::v1::DataSpec(), "data: no source set");
  auto spec = SequenceSpec(gpipe::v1::COPY, 0, 5);
  ExpectSpecError(spec, "data.synthetic.vocab_size: must be positive");
  spec = SequenceSpec(gpipe::v1::REVERSE, 4, -1);
  ExpectSpecError(spec, "data.synthetic.length:");
  spec = SequenceSpec(gpipe::v1::SYNTHETIC_TASK_UNSPECIFIED, 4, 4);
  ExpectSpecError(spec, "data.synthetic.task:");
  spec = SequenceSpec(gpipe::v1::COPY, 4, 4);
  spec.mutable_synthetic()->set_train_samples(0);
  ExpectSpecError(spec, "data.synthetic.train_samples:");
  spec = SequenceSpec(gpipe::v1::COPY, 4, 4);
  spec.mutable_synthetic()->set_test_samples(-1);
  ExpectSpecError(spec, "data.synthetic.test_samples:");
  spec = SequenceSpec(gpipe::v1::CLASSES, 0, 0);
  ExpectSpecError(spec, "data.synthetic.features:");
  spec.mutable_synthetic()->set_features(3);
  ExpectSpecError(spec, "data.synthetic.classes:");
}

}  // namespace
}  // namespace gpipe
