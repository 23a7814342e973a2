// BatchPrefetch: each step's batch is the sampler's and the dataset's, the
// next step's is gathered on another thread while the caller works, and a
// step out of order (a restore) gets its own batch.
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "services/data/batch_prefetch.h"
#include "services/data/synthetic.h"

namespace gpipe {
namespace {

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

v1::Synthetic Gaussian() {
  v1::Synthetic spec;
  spec.set_task(v1::CLASSES);
  spec.set_features(12);
  spec.set_classes(3);
  spec.set_train_samples(50);
  spec.set_test_samples(10);
  return spec;
}

// A dataset that records the threads its gathers run on.
class RecordingDataset : public Dataset {
 public:
  explicit RecordingDataset(std::unique_ptr<Dataset> inner)
      : inner_(std::move(inner)) {}
  int64_t size(Split s) const override { return inner_->size(s); }
  Shape input_shape() const override { return inner_->input_shape(); }
  DType input_dtype() const override { return inner_->input_dtype(); }
  Shape target_shape() const override { return inner_->target_shape(); }
  int64_t num_classes() const override { return inner_->num_classes(); }
  Batch Gather(Split split,
               const std::vector<int64_t>& indices) const override {
    Record();
    return inner_->Gather(split, indices);
  }
  Tensor GatherTargets(Split split,
                       const std::vector<int64_t>& indices) const override {
    Record();
    return inner_->GatherTargets(split, indices);
  }
  std::vector<std::thread::id> threads() const {
    absl::MutexLock lock(&mu_);
    return threads_;
  }

 private:
  void Record() const {
    absl::MutexLock lock(&mu_);
    threads_.push_back(std::this_thread::get_id());
  }
  std::unique_ptr<Dataset> inner_;
  mutable absl::Mutex mu_;
  mutable std::vector<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
};

TEST(BatchPrefetch, EachStepIsTheSamplersBatchGatheredAhead) {
  auto inner = MakeSynthetic(Gaussian(), 5);
  ASSERT_TRUE(inner.ok()) << inner.status();
  RecordingDataset dataset(std::move(*inner));
  // 7 does not divide 50: batches straddle epochs.
  const Sampler sampler(9, dataset.size(Split::kTrain), 7);
  BatchPrefetch prefetch(&dataset, &sampler, BatchPrefetch::Part::kWhole);
  for (int64_t step = 0; step < 20; ++step) {
    const Batch got = prefetch.Take(step);
    const Batch want = dataset.Gather(Split::kTrain, sampler.Indices(step));
    EXPECT_TRUE(SameBytes(got.inputs, want.inputs)) << step;
    EXPECT_TRUE(SameBytes(got.targets, want.targets)) << step;
  }
  // The first step's batch was gathered on the caller's thread; every later
  // one ahead, on another.
  EXPECT_EQ(prefetch.taken_ahead(), 19);
  int64_t elsewhere = 0;
  for (std::thread::id id : dataset.threads())
    elsewhere += id != std::this_thread::get_id();
  EXPECT_GE(elsewhere, 19);
}

TEST(BatchPrefetch, AStepOutOfOrderGetsItsOwnBatch) {
  auto dataset = MakeSynthetic(Gaussian(), 5);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Sampler sampler(9, (*dataset)->size(Split::kTrain), 8);
  BatchPrefetch prefetch(dataset->get(), &sampler, BatchPrefetch::Part::kWhole);
  // 0, 1, 2 in order; then back to 1 (a restore), then 2 again.
  for (int64_t step : {0, 1, 2, 1, 2, 40}) {
    const Batch got = prefetch.Take(step);
    const Batch want = (*dataset)->Gather(Split::kTrain, sampler.Indices(step));
    EXPECT_TRUE(SameBytes(got.inputs, want.inputs)) << step;
    EXPECT_TRUE(SameBytes(got.targets, want.targets)) << step;
  }
  // Ahead: 1, 2 and the second 2; not the first step, the restored 1 or 40.
  EXPECT_EQ(prefetch.taken_ahead(), 3);
}

TEST(BatchPrefetch, TargetsOnly) {
  auto dataset = MakeSynthetic(Gaussian(), 5);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Sampler sampler(2, (*dataset)->size(Split::kTrain), 5);
  BatchPrefetch prefetch(dataset->get(), &sampler,
                         BatchPrefetch::Part::kTargets);
  for (int64_t step = 0; step < 4; ++step) {
    const Batch got = prefetch.Take(step);
    EXPECT_FALSE(got.inputs.defined());
    EXPECT_TRUE(SameBytes(
        got.targets,
        (*dataset)->GatherTargets(Split::kTrain, sampler.Indices(step))));
  }
}

// Destroyed with a gather under way or queued: it waits, and nothing runs
// after (the sanitizers' and the dataset's lifetime check this).
TEST(BatchPrefetch, GoesAwayWithAGatherUnderWay) {
  auto dataset = MakeSynthetic(Gaussian(), 5);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  const Sampler sampler(2, (*dataset)->size(Split::kTrain), 50);
  for (int round = 0; round < 20; ++round) {
    BatchPrefetch prefetch(dataset->get(), &sampler,
                           BatchPrefetch::Part::kWhole);
    prefetch.Take(round);
  }
}

}  // namespace
}  // namespace gpipe
