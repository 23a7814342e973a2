// The sampler: indices are a pure function of (seed, step), and each epoch
// visits every sample exactly once.
#include <algorithm>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/sampler.h"

namespace gpipe {
namespace {

// The global order of samples over the first `steps` steps.
std::vector<int64_t> Stream(const Sampler& s, int64_t steps) {
  std::vector<int64_t> out;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<int64_t> b = s.Indices(step);
    EXPECT_EQ(static_cast<int64_t>(b.size()), s.batch_size());
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

// The batches in figures: python/gpipe/sampler.py ports this sampler, and
// python/tests/test_sampler.py pins the same ones, so neither side can
// drift alone (a PyTorch loop fed by the port would train on other data).
TEST(Sampler, BatchesArePinned) {
  const Sampler sampler(3, 10, 4);
  EXPECT_THAT(sampler.Indices(0), ::testing::ElementsAre(5, 4, 0, 7));
  EXPECT_THAT(sampler.Indices(1), ::testing::ElementsAre(1, 2, 8, 3));
  EXPECT_THAT(sampler.Indices(2), ::testing::ElementsAre(6, 9, 9, 6));
  EXPECT_THAT(sampler.Indices(3), ::testing::ElementsAre(7, 0, 3, 8));
  EXPECT_THAT(Sampler(~uint64_t{0}, 7, 5).Indices(3),
              ::testing::ElementsAre(3, 6, 4, 0, 5));
}

TEST(Sampler, SameSeedSameIndices) {
  Sampler a(42, 100, 8), b(42, 100, 8);
  for (int64_t step : {0, 1, 12, 13, 500, 7}) {
    EXPECT_EQ(a.Indices(step), b.Indices(step)) << step;
  }
}

TEST(Sampler, EveryEpochIsAPermutation) {
  // 7 does not divide 100: batches straddle epoch boundaries.
  const int64_t n = 100, batch = 7;
  Sampler s(3, n, batch);
  const std::vector<int64_t> stream = Stream(s, 5 * n / batch + 1);
  std::vector<std::vector<int64_t>> epochs;
  for (size_t e = 0; (e + 1) * n <= stream.size(); ++e) {
    std::vector<int64_t> epoch(stream.begin() + e * n,
                               stream.begin() + (e + 1) * n);
    std::vector<int64_t> sorted = epoch;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i) << "epoch " << e;
    epochs.push_back(epoch);
  }
  ASSERT_GE(epochs.size(), 5u);
  // Each epoch is shuffled, and shuffled differently.
  std::vector<int64_t> identity(n);
  for (int64_t i = 0; i < n; ++i) identity[i] = i;
  EXPECT_NE(epochs[0], identity);
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
}

TEST(Sampler, BatchLargerThanDataset) {
  Sampler s(9, 5, 12);
  const std::vector<int64_t> stream = Stream(s, 5);  // 60 = 12 epochs
  for (int e = 0; e < 12; ++e) {
    std::vector<int64_t> epoch(stream.begin() + 5 * e,
                               stream.begin() + 5 * e + 5);
    std::sort(epoch.begin(), epoch.end());
    EXPECT_THAT(epoch, ::testing::ElementsAre(0, 1, 2, 3, 4));
  }
  EXPECT_EQ(s.Epoch(0), 0);
  EXPECT_EQ(s.Epoch(1), 2);  // sample 12 is in epoch 2
}

TEST(Sampler, SingleSample) {
  Sampler s(1, 1, 3);
  EXPECT_THAT(s.Indices(4), ::testing::ElementsAre(0, 0, 0));
}

TEST(Sampler, DifferentSeedsDiffer) {
  Sampler a(1, 1000, 32), b(2, 1000, 32);
  EXPECT_NE(a.Indices(0), b.Indices(0));
  EXPECT_NE(a.Indices(100), b.Indices(100));
}

TEST(Sampler, CallOrderDoesNotMatter) {
  const int64_t steps = 60;
  Sampler forward(5, 50, 9);
  std::vector<std::vector<int64_t>> expected;
  for (int64_t step = 0; step < steps; ++step) {
    expected.push_back(forward.Indices(step));
  }
  // Backwards, then jumping around, on a fresh sampler.
  Sampler other(5, 50, 9);
  for (int64_t step = steps - 1; step >= 0; --step) {
    EXPECT_EQ(other.Indices(step), expected[step]) << step;
  }
  for (int64_t step : {30, 2, 59, 0, 31, 17, 58, 1}) {
    EXPECT_EQ(other.Indices(step), expected[step]) << step;
  }
  // A restarted job that resumes at step 40 sees the same batches.
  Sampler resumed(5, 50, 9);
  for (int64_t step = 40; step < steps; ++step) {
    EXPECT_EQ(resumed.Indices(step), expected[step]) << step;
  }
}

TEST(Sampler, ConcurrentCallsAgree) {
  const int64_t steps = 200;
  Sampler reference(11, 37, 5);
  std::vector<std::vector<int64_t>> expected;
  for (int64_t step = 0; step < steps; ++step) {
    expected.push_back(reference.Indices(step));
  }
  Sampler shared(11, 37, 5);
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t k = 0; k < steps; ++k) {
        const int64_t step = (k * (2 * t + 1) + t * 13) % steps;
        if (shared.Indices(step) != expected[step]) ++mismatches[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_THAT(mismatches, ::testing::Each(0));
}

TEST(Sampler, Epoch) {
  Sampler s(0, 100, 30);
  EXPECT_EQ(s.Epoch(0), 0);
  EXPECT_EQ(s.Epoch(3), 0);  // samples 90..119 start in epoch 0
  EXPECT_EQ(s.Epoch(4), 1);
  EXPECT_EQ(s.Epoch(10), 3);
}

}  // namespace
}  // namespace gpipe
