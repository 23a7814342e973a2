#include "services/telemetry/metered_link.h"

#include <chrono>
#include <utility>

namespace gpipe {
namespace {

// Scalar messages (the clipping norm) carry no tensor.
int64_t TensorBytes(const Message& m) {
  return m.tensor.defined() ? static_cast<int64_t>(m.tensor.nbytes()) : 0;
}

}  // namespace

absl::Status MeteredLink::Send(Message message) {
  const int64_t bytes = TensorBytes(message);
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = inner_->Send(std::move(message));
  if (status.ok()) {
    metrics_->ObserveSend(bytes, std::chrono::duration<double>(
                                     std::chrono::steady_clock::now() - start)
                                     .count());
  }
  return status;
}

absl::StatusOr<Message> MeteredLink::Receive() {
  absl::StatusOr<Message> message = inner_->Receive();
  if (message.ok()) metrics_->ObserveReceive(TensorBytes(*message));
  return message;
}

}  // namespace gpipe
