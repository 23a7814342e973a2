#include "services/transport/ordered_releaser.h"

#include <chrono>

namespace gpipe {

OrderedReleaser::OrderedReleaser(std::function<absl::Status(int64_t)> await,
                                 std::function<bool(int64_t)> release)
    : await_(std::move(await)),
      release_(std::move(release)),
      thread_([this] { Run(); }) {}

OrderedReleaser::~OrderedReleaser() {
  Stop(absl::CancelledError("the link closed"));
  thread_.join();
}

absl::Status OrderedReleaser::Add(int64_t sequence) {
  absl::MutexLock lock(&mu_);
  if (!stopped_.ok()) return stopped_;
  pending_.push_back(sequence);
  return absl::OkStatus();
}

void OrderedReleaser::Stop(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (stopped_.ok()) {
    stopped_ = why.ok() ? absl::CancelledError("stopped") : std::move(why);
  }
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
        return !stopped_.ok() || !pending_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (!stopped_.ok()) return;
      sequence = pending_.front();
      pending_.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = await_(sequence);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (s.ok() && !release_(sequence)) {
      s = absl::UnavailableError("the neighbouring stage closed the link");
    }
    absl::MutexLock lock(&mu_);
    await_seconds_ += waited;
    if (!s.ok() && stopped_.ok()) stopped_ = std::move(s);
  }
}

}  // namespace gpipe
