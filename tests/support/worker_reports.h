// What worker executors report, collected for a test that runs them in its
// own process (their Reporter), with bounded waits for their ends.
#ifndef GPIPE_TESTS_SUPPORT_WORKER_REPORTS_H_
#define GPIPE_TESTS_SUPPORT_WORKER_REPORTS_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "gpipe/v1/controller.pb.h"

namespace gpipe::test_support {

class WorkerReports {
 public:
  void Add(const gpipe::v1::WorkerMessage& m) {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.push_back(m);
    cv_.notify_all();
  }
  // Waits (at most a minute) until `n` stages finished or failed; how many
  // did.
  int WaitEnded(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(60),
                 [&] { return Count(true) + Count(false) >= n; });
    return Count(true) + Count(false);
  }
  // Waits (at most a minute) until `n` stages finished or one failed;
  // whether `n` finished. The first failure's message goes to `failure`.
  bool WaitFinished(int n, std::string* failure) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(60),
                 [&] { return Count(true) >= n || Count(false) > 0; });
    for (const auto& m : messages_) {
      if (m.has_failed() && failure->empty()) *failure = m.failed().message();
    }
    return Count(true) >= n;
  }
  std::vector<gpipe::v1::WorkerMessage> All() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    messages_.clear();
  }

 private:
  int Count(bool finished) const {
    int n = 0;
    for (const auto& m : messages_) {
      n += finished ? m.has_finished() : m.has_failed();
    }
    return n;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<gpipe::v1::WorkerMessage> messages_;
};

}  // namespace gpipe::test_support

#endif  // GPIPE_TESTS_SUPPORT_WORKER_REPORTS_H_
