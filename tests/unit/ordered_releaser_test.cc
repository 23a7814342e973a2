// The CUDA IPC plane's releasing thread on the CPU, with copies out that
// end when the test says: releases go in order, each only after its own
// copy, a failure stops it with its reason, and stopping does not wait for
// what is still queued.
#include "services/transport/ordered_releaser.h"

#include <chrono>
#include <condition_variable>
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

TEST(OrderedReleaserTest, ReleasesInOrderEachAfterItsCopy) {
  FakeLink link;
  OrderedReleaser r([&](int64_t s) { return link.Await(s); },
                    [&](int64_t s) { return link.Release(s); });
  for (int64_t s = 0; s < 4; ++s) ASSERT_TRUE(r.Add(s).ok());
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

TEST(OrderedReleaserTest, AFailedCopyStopsItWithItsReason) {
  FakeLink link;
  OrderedReleaser r([&](int64_t s) { return link.Await(s); },
                    [&](int64_t s) { return link.Release(s); });
  ASSERT_TRUE(r.Add(0).ok());
  ASSERT_TRUE(r.Add(1).ok());
  link.Finish(0);
  link.Fail(1);
  EXPECT_THAT(link.Released(1), ElementsAre(0));
  // The failure reaches the next Add (bounded wait for the thread).
  absl::Status s;
  for (int i = 0; i < 1000 && s.ok(); ++i) {
    s = r.Add(2);
    if (s.ok()) std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("copy out failed"));
  link.Finish(2);
  std::this_thread::sleep_for(50ms);
  EXPECT_THAT(link.Released(0), ElementsAre(0));  // 1 and 2 never go back
}

TEST(OrderedReleaserTest, ABrokenLinkStopsIt) {
  FakeLink link;
  link.Break();
  OrderedReleaser r([&](int64_t s) { return link.Await(s); },
                    [&](int64_t s) { return link.Release(s); });
  ASSERT_TRUE(r.Add(0).ok());
  link.Finish(0);
  absl::Status s;
  for (int i = 0; i < 1000 && s.ok(); ++i) {
    s = r.Add(1);
    if (s.ok()) std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("closed the link"));
}

TEST(OrderedReleaserTest, StoppingDropsWhatIsQueuedAndRefusesMore) {
  FakeLink link;
  const auto start = std::chrono::steady_clock::now();
  {
    OrderedReleaser r([&](int64_t s) { return link.Await(s); },
                      [&](int64_t s) { return link.Release(s); });
    ASSERT_TRUE(r.Add(0).ok());
    ASSERT_TRUE(link.Awaiting(0));
    ASSERT_TRUE(r.Add(1).ok());  // queued behind 0's copy
    r.Stop(absl::UnavailableError("the peer went away"));
    absl::Status s = r.Add(2);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(s.message(), HasSubstr("peer went away"));
    link.Finish(0);  // the copy in progress ends; the thread then stops
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  // 0's release was already under way when Stop came, or not: never 1.
  for (int64_t s : link.Released(0)) EXPECT_EQ(s, 0);
}

}  // namespace
}  // namespace gpipe
