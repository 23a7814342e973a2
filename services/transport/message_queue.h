// A bounded FIFO of messages between two threads. Push blocks while full
// (back-pressure); Close lets the consumer drain what is queued, then every
// Pop returns the close status.
#ifndef GPIPE_SERVICES_TRANSPORT_MESSAGE_QUEUE_H_
#define GPIPE_SERVICES_TRANSPORT_MESSAGE_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/transport/link.h"

namespace gpipe {

class MessageQueue {
 public:
  explicit MessageQueue(size_t capacity) : capacity_(capacity) {}

  absl::Status Push(Message m) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock,
                   [&] { return !status_.ok() || queue_.size() < capacity_; });
    if (!status_.ok()) return status_;
    queue_.push_back(std::move(m));
    not_empty_.notify_one();
    return absl::OkStatus();
  }

  absl::StatusOr<Message> Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return !status_.ok() || !queue_.empty(); });
    if (queue_.empty()) return status_;
    Message m = std::move(queue_.front());
    queue_.pop_front();
    not_full_.notify_one();
    return m;
  }

  // The first close wins; `status` must not be OK.
  void Close(absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = std::move(status);
    not_full_.notify_all();
    not_empty_.notify_all();
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable not_full_, not_empty_;
  std::deque<Message> queue_;
  absl::Status status_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_MESSAGE_QUEUE_H_
