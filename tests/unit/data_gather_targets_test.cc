// Dataset::GatherTargets (what the last stage reads) gives bitwise the
// targets Gather gives, for every kind of dataset.
#include <filesystem>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "services/data/dataset.h"
#include "services/data/fashion_mnist.h"

namespace gpipe {
namespace {

void ExpectSameTargets(const Dataset& d) {
  for (Split split : {Split::kTrain, Split::kTest}) {
    const int64_t n = d.size(split);
    ASSERT_GT(n, 10);
    std::vector<int64_t> indices = {n - 1, 0, 7, 3, 3, n / 2};
    const Batch batch = d.Gather(split, indices);
    const Tensor targets = d.GatherTargets(split, indices);
    EXPECT_TRUE(BitwiseEqual(targets, batch.targets));
  }
}

std::unique_ptr<Dataset> Open(const gpipe::v1::DataSpec& spec,
                              const Shape& input) {
  auto d = OpenDataset(spec, input, /*seed=*/11);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

TEST(GatherTargets, GaussianClasses) {
  gpipe::v1::DataSpec spec;
  auto* s = spec.mutable_synthetic();
  s->set_task(gpipe::v1::CLASSES);
  s->set_features(32);
  s->set_classes(5);
  s->set_train_samples(1000);
  s->set_test_samples(100);
  auto d = Open(spec, Shape{32});
  ASSERT_NE(d, nullptr);
  ExpectSameTargets(*d);
}

TEST(GatherTargets, SequenceTask) {
  gpipe::v1::DataSpec spec;
  auto* s = spec.mutable_synthetic();
  s->set_task(gpipe::v1::REVERSE);
  s->set_vocab_size(10);
  s->set_length(6);
  s->set_train_samples(1000);
  s->set_test_samples(100);
  auto d = Open(spec, Shape());
  ASSERT_NE(d, nullptr);
  ExpectSameTargets(*d);
}

TEST(GatherTargets, FashionMnist) {
  if (!std::filesystem::exists(FashionMnist::kDefaultDir)) {
    GTEST_SKIP() << FashionMnist::kDefaultDir << " is not installed";
  }
  gpipe::v1::DataSpec spec;
  spec.mutable_fashion_mnist();
  auto d = Open(spec, Shape{784});
  ASSERT_NE(d, nullptr);
  ExpectSameTargets(*d);
}

}  // namespace
}  // namespace gpipe
