#include "services/transport/in_process_link.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace gpipe {

namespace {

// One direction: a bounded FIFO shared by both ends, closed by either.
class Channel {
 public:
  explicit Channel(size_t capacity) : capacity_(capacity) {}

  absl::Status Push(Message m) {
    std::unique_lock<std::mutex> lock(mu_);
    not_full_.wait(lock, [&] { return closed_ || queue_.size() < capacity_; });
    if (closed_) return absl::CancelledError("link closed");
    queue_.push_back(std::move(m));
    not_empty_.notify_one();
    return absl::OkStatus();
  }

  absl::StatusOr<Message> Pop() {
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return closed_ || !queue_.empty(); });
    if (queue_.empty()) return absl::CancelledError("link closed");
    Message m = std::move(queue_.front());
    queue_.pop_front();
    not_full_.notify_one();
    return m;
  }

  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    not_full_.notify_all();
    not_empty_.notify_all();
  }

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable not_full_, not_empty_;
  std::deque<Message> queue_;
  bool closed_ = false;
};

struct Shared {
  explicit Shared(size_t capacity) : a_to_b(capacity), b_to_a(capacity) {}
  Channel a_to_b, b_to_a;
};

class InProcessLink final : public Link {
 public:
  InProcessLink(std::shared_ptr<Shared> shared, Channel* out, Channel* in)
      : shared_(std::move(shared)), out_(out), in_(in) {}
  ~InProcessLink() override { Close(); }

  absl::Status Send(Message m) override {
    if (m.tensor.defined()) {
      // The copy a serializer would make: the sender's activation memory is
      // free as soon as Send returns.
      AllocatorScope transport(DefaultCpuAllocator());
      m.tensor = m.tensor.Clone();
      sent_ += m.tensor.nbytes();
    }
    return out_->Push(std::move(m));
  }

  absl::StatusOr<Message> Receive() override {
    absl::StatusOr<Message> m = in_->Pop();
    if (m.ok() && m->tensor.defined()) {
      m->tensor = m->tensor.Clone();  // into the receiver's allocator
      received_ += m->tensor.nbytes();
    }
    return m;
  }

  void Close() override {
    out_->Close();
    in_->Close();
  }

  int64_t bytes_sent() const override { return sent_.load(); }
  int64_t bytes_received() const override { return received_.load(); }

 private:
  std::shared_ptr<Shared> shared_;
  Channel* out_;
  Channel* in_;
  std::atomic<int64_t> sent_{0}, received_{0};
};

}  // namespace

std::pair<std::unique_ptr<Link>, std::unique_ptr<Link>> MakeInProcessLinkPair(
    size_t capacity) {
  auto shared = std::make_shared<Shared>(capacity);
  auto a =
      std::make_unique<InProcessLink>(shared, &shared->a_to_b, &shared->b_to_a);
  auto b =
      std::make_unique<InProcessLink>(shared, &shared->b_to_a, &shared->a_to_b);
  return {std::move(a), std::move(b)};
}

}  // namespace gpipe
