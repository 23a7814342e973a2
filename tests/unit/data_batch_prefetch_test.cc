// BatchPrefetch: each step's batch is the sampler's and the dataset's, the
// next step's is gathered on another thread while the caller works, and a
// step out of order (a restore) gets its own batch.
#include <atomic>
#include <cstring>
#include <new>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

// A dataset that records the threads its gathers run on; each gather
// takes at least `delay` and counts as under way until it returns.
class RecordingDataset : public Dataset {
 public:
  explicit RecordingDataset(std::unique_ptr<Dataset> inner,
                            absl::Duration delay = absl::ZeroDuration())
      : inner_(std::move(inner)), delay_(delay) {}
  int64_t size(Split s) const override { return inner_->size(s); }
  Shape input_shape() const override { return inner_->input_shape(); }
  DType input_dtype() const override { return inner_->input_dtype(); }
  Shape target_shape() const override { return inner_->target_shape(); }
  int64_t num_classes() const override { return inner_->num_classes(); }
  Batch Gather(Split split,
               const std::vector<int64_t>& indices) const override {
    Record();
    ++under_way_;
    absl::SleepFor(delay_);
    Batch b = inner_->Gather(split, indices);
    --under_way_;
    return b;
  }
  int under_way() const { return under_way_.load(); }
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
  absl::Duration delay_;
  mutable std::atomic<int> under_way_{0};
  mutable absl::Mutex mu_;
  mutable std::vector<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
};

// Each of `steps` taken from `prefetch` is the sampler's batch as the
// dataset gathers it.
void ExpectSamplersBatches(BatchPrefetch& prefetch, const Dataset& dataset,
                           const Sampler& sampler,
                           const std::vector<int64_t>& steps) {
  for (int64_t step : steps) {
    const Batch got = prefetch.Take(step);
    const Batch want = dataset.Gather(Split::kTrain, sampler.Indices(step));
    EXPECT_TRUE(SameBytes(got.inputs, want.inputs)) << step;
    EXPECT_TRUE(SameBytes(got.targets, want.targets)) << step;
  }
}

TEST(BatchPrefetch, EachStepIsTheSamplersBatchGatheredAhead) {
  auto inner = MakeSynthetic(Gaussian(), 5);
  ASSERT_TRUE(inner.ok()) << inner.status();
  RecordingDataset dataset(std::move(*inner));
  // 7 does not divide 50: batches straddle epochs.
  const Sampler sampler(9, dataset.size(Split::kTrain), 7);
  BatchPrefetch prefetch(&dataset, &sampler, BatchPrefetch::Part::kWhole);
  std::vector<int64_t> steps(20);
  std::iota(steps.begin(), steps.end(), 0);
  ExpectSamplersBatches(prefetch, dataset, sampler, steps);
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
  ExpectSamplersBatches(prefetch, **dataset, sampler, {0, 1, 2, 1, 2, 40});
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

// A dataset whose gathers fail (out of memory) on every thread but the
// one that made it.
class FailingElsewhere : public RecordingDataset {
 public:
  using RecordingDataset::RecordingDataset;
  Batch Gather(Split split,
               const std::vector<int64_t>& indices) const override {
    if (std::this_thread::get_id() != owner_) throw std::bad_alloc();
    return RecordingDataset::Gather(split, indices);
  }

 private:
  std::thread::id owner_ = std::this_thread::get_id();
};

// A gather that fails ahead kills nothing: the caller gathers the batch
// itself (where a stage's thread would turn a failure into its status).
TEST(BatchPrefetch, AGatherThatFailsAheadIsMadeByTheCaller) {
  auto inner = MakeSynthetic(Gaussian(), 5);
  ASSERT_TRUE(inner.ok()) << inner.status();
  FailingElsewhere dataset(std::move(*inner));
  const Sampler sampler(9, dataset.size(Split::kTrain), 7);
  BatchPrefetch prefetch(&dataset, &sampler, BatchPrefetch::Part::kWhole);
  for (int64_t step = 0; step < 4; ++step) {
    const Batch got = prefetch.Take(step);
    const Batch want = dataset.Gather(Split::kTrain, sampler.Indices(step));
    EXPECT_TRUE(SameBytes(got.inputs, want.inputs)) << step;
  }
  EXPECT_EQ(prefetch.taken_ahead(), 0);
}

// Destroyed with a gather under way: it waits for it, so no gather runs
// on past it (or past the dataset, which goes after it).
TEST(BatchPrefetch, GoesAwayWithAGatherUnderWay) {
  auto inner = MakeSynthetic(Gaussian(), 5);
  ASSERT_TRUE(inner.ok()) << inner.status();
  RecordingDataset dataset(std::move(*inner), absl::Milliseconds(20));
  const Sampler sampler(2, dataset.size(Split::kTrain), 50);
  for (int round = 0; round < 3; ++round) {
    {
      BatchPrefetch prefetch(&dataset, &sampler, BatchPrefetch::Part::kWhole);
      prefetch.Take(round);
      // Until the next step's gather is under way (bounded: 2 s).
      for (int i = 0; i < 2000 && dataset.under_way() == 0; ++i)
        absl::SleepFor(absl::Milliseconds(1));
      EXPECT_EQ(dataset.under_way(), 1);
    }
    EXPECT_EQ(dataset.under_way(), 0) << "a gather outlived its prefetch";
  }
}

}  // namespace
}  // namespace gpipe
