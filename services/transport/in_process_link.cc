#include "services/transport/in_process_link.h"

#include <atomic>

#include "services/transport/message_queue.h"

namespace gpipe {

namespace {

struct Shared {
  explicit Shared(size_t capacity) : a_to_b(capacity), b_to_a(capacity) {}
  MessageQueue a_to_b, b_to_a;  // one per direction, closed by either end
};

class InProcessLink final : public Link {
 public:
  InProcessLink(std::shared_ptr<Shared> shared, MessageQueue* out,
                MessageQueue* in)
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
    out_->Close(absl::CancelledError("link closed"));
    in_->Close(absl::CancelledError("link closed"));
  }

  int64_t bytes_sent() const override { return sent_.load(); }
  int64_t bytes_received() const override { return received_.load(); }

 private:
  std::shared_ptr<Shared> shared_;
  MessageQueue* out_;
  MessageQueue* in_;
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
