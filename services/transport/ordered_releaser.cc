#include "services/transport/ordered_releaser.h"

#include <chrono>

namespace gpipe {

OrderedReleaser::OrderedReleaser(std::function<absl::Status(int64_t)> await,
                                 std::function<bool(int64_t)> release)
    : await_(std::move(await)),
      release_(std::move(release)),
      thread_([this] { Run(); }) {}

OrderedReleaser::~OrderedReleaser() { Stop(); }

absl::StatusOr<bool> OrderedReleaser::Add(int64_t sequence) {
  absl::MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  if (stopping_) {
    // The chunks queued before go back first.
    mu_.Await(absl::Condition(&exited_));
    if (!failed_.ok()) return failed_;
    return false;
  }
  pending_.push_back(sequence);
  return true;
}

void OrderedReleaser::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

double OrderedReleaser::await_seconds() const {
  absl::MutexLock lock(&mu_);
  return await_seconds_;
}

void OrderedReleaser::Run() {
  for (;;) {
    int64_t sequence = 0;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !pending_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      // After a failure nothing more goes back (the link or the device is
      // gone); otherwise the queue drains before the thread ends.
      if (!failed_.ok()) pending_.clear();
      if (pending_.empty()) {
        exited_ = true;
        return;
      }
      sequence = pending_.front();
      pending_.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = await_(sequence);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (s.ok() && !release_(sequence)) {
      s = absl::UnavailableError(
          "the neighbouring stage closed the link or stopped "
          "answering");
    }
    absl::MutexLock lock(&mu_);
    await_seconds_ += waited;
    if (!s.ok() && failed_.ok()) failed_ = std::move(s);
  }
}

}  // namespace gpipe
