// The CUDA IPC plane's releasing thread on the CPU, with copies out that
// end when the test says: releases go in order, each only after its own
// copy; a failure ends them with its reason; stopping gives back what is
// queued first, and the caller then releases in order itself.
#include "services/transport/ordered_releaser.h"

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

// Copies out that finish when Finish says, and the releases seen.
class FakeLink {
 public:
  absl::Status Await(int64_t sequence) {
    std::unique_lock<std::mutex> lock(mu_);
    awaited_.push_back(sequence);
    changed_.notify_all();
    // Bounded: a test that forgets a copy fails instead of hanging.
    if (!changed_.wait_for(lock, 10s, [&] {
          return finished_.count(sequence) > 0 || failing_.count(sequence);
        })) {
      return absl::DeadlineExceededError("copy never finished");
    }
    if (failing_.count(sequence))
      return absl::InternalError("the copy out failed");
    return absl::OkStatus();
  }
  bool Release(int64_t sequence) {
    std::lock_guard<std::mutex> lock(mu_);
    released_.push_back(sequence);
    changed_.notify_all();
    return !broken_;
  }
  void Finish(int64_t sequence) {
    std::lock_guard<std::mutex> lock(mu_);
    finished_.insert(sequence);
    changed_.notify_all();
  }
  void Fail(int64_t sequence) {
    std::lock_guard<std::mutex> lock(mu_);
    failing_.insert(sequence);
    changed_.notify_all();
  }
  void Break() {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
  }
  // Waits (bounded) until `n` releases were made, then returns them all.
  std::vector<int64_t> Released(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, 10s, [&] { return released_.size() >= n; });
    return released_;
  }
  // Waits (bounded) until the releaser waits for `sequence`'s copy.
  bool Awaiting(int64_t sequence) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, 10s, [&] {
      return !awaited_.empty() && awaited_.back() == sequence;
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<int64_t> awaited_, released_;
  std::set<int64_t> finished_, failing_;
  bool broken_ = false;
};

// Adds `sequence`, expecting it queued.
void Queue(OrderedReleaser& r, int64_t sequence) {
  absl::StatusOr<bool> queued = r.Add(sequence);
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_TRUE(*queued);
}

// Adds until the releaser reports a failure (bounded), and returns it.
absl::Status FirstFailure(OrderedReleaser& r, int64_t sequence) {
  for (int i = 0; i < 1000; ++i) {
    absl::StatusOr<bool> queued = r.Add(sequence);
    if (!queued.ok()) return queued.status();
    std::this_thread::sleep_for(5ms);
  }
  return absl::OkStatus();
}

TEST(OrderedReleaserTest, ReleasesInOrderEachAfterItsCopy) {
  FakeLink link;
  OrderedReleaser r([&](int64_t s) { return link.Await(s); },
                    [&](int64_t s) { return link.Release(s); });
  for (int64_t s = 0; s < 4; ++s) Queue(r, s);
  // Later copies end first: nothing may go back before chunk 0's.
  link.Finish(2);
  link.Finish(1);
  ASSERT_TRUE(link.Awaiting(0));
  std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(link.Released(0).empty());
  link.Finish(0);
  EXPECT_THAT(link.Released(3), ElementsAre(0, 1, 2));
  // Chunk 3 waits for its own copy.
  ASSERT_TRUE(link.Awaiting(3));
  EXPECT_EQ(link.Released(0).size(), 3u);
  link.Finish(3);
  EXPECT_THAT(link.Released(4), ElementsAre(0, 1, 2, 3));
  EXPECT_GT(r.await_seconds(), 0.04);
}

TEST(OrderedReleaserTest, AFailedCopyEndsTheReleasesWithItsReason) {
  FakeLink link;
  OrderedReleaser r([&](int64_t s) { return link.Await(s); },
                    [&](int64_t s) { return link.Release(s); });
  Queue(r, 0);
  Queue(r, 1);
  link.Finish(0);
  link.Fail(1);
  EXPECT_THAT(link.Released(1), ElementsAre(0));
  const absl::Status s = FirstFailure(r, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("copy out failed"));
  link.Finish(2);
  r.Stop();
  EXPECT_THAT(link.Released(0), ElementsAre(0));  // 1 and 2 never go back
}

TEST(OrderedReleaserTest, ABrokenLinkEndsTheReleases) {
  FakeLink link;
  link.Break();
  OrderedReleaser r([&](int64_t s) { return link.Await(s); },
                    [&](int64_t s) { return link.Release(s); });
  Queue(r, 0);
  link.Finish(0);
  const absl::Status s = FirstFailure(r, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("closed the link"));
}

TEST(OrderedReleaserTest, StopGivesBackWhatIsQueuedThenTheCallerReleases) {
  FakeLink link;
  OrderedReleaser r([&](int64_t s) { return link.Await(s); },
                    [&](int64_t s) { return link.Release(s); });
  Queue(r, 0);
  Queue(r, 1);
  ASSERT_TRUE(link.Awaiting(0));
  std::future<void> stopped = std::async(std::launch::async, [&] { r.Stop(); });
  std::this_thread::sleep_for(20ms);  // most often Stop has begun by now
  // A chunk read while the link ends: queued if it came before Stop, else
  // the caller's to release once 0 and 1 went back, never before.
  struct Added {
    absl::StatusOr<bool> queued;
    std::vector<int64_t> released_then;
  };
  std::future<Added> added = std::async(std::launch::async, [&] {
    absl::StatusOr<bool> queued = r.Add(2);
    return Added{queued, link.Released(0)};
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(stopped.wait_for(0ms), std::future_status::timeout);
  link.Finish(0);
  link.Finish(1);
  link.Finish(2);
  ASSERT_EQ(stopped.wait_for(10s), std::future_status::ready);
  ASSERT_EQ(added.wait_for(10s), std::future_status::ready);
  const Added a = added.get();
  ASSERT_TRUE(a.queued.ok()) << a.queued.status();
  if (*a.queued) {
    EXPECT_THAT(link.Released(3), ElementsAre(0, 1, 2));
  } else {
    EXPECT_THAT(a.released_then, ElementsAre(0, 1));
    EXPECT_THAT(link.Released(2), ElementsAre(0, 1));
  }
  // After Stop every chunk is the caller's, at once.
  absl::StatusOr<bool> later = r.Add(3);
  ASSERT_TRUE(later.ok());
  EXPECT_FALSE(*later);
}

TEST(OrderedReleaserTest, DestroyedIdleItEndsAtOnce) {
  FakeLink link;
  const auto start = std::chrono::steady_clock::now();
  {
    OrderedReleaser r([&](int64_t s) { return link.Await(s); },
                      [&](int64_t s) { return link.Release(s); });
    Queue(r, 0);
    link.Finish(0);
    EXPECT_THAT(link.Released(1), ElementsAre(0));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace
}  // namespace gpipe
