#include "services/transport/cuda_ipc_channel.h"

#include "services/core/status.h"

namespace gpipe {

CudaIpcChannel::CudaIpcChannel(std::unique_ptr<CudaIpcBuffer> buffer,
                               bool creator, std::string job_id, int64_t epoch)
    : buffer_(std::move(buffer)),
      out_(creator ? CudaIpcBuffer::kDownstream : CudaIpcBuffer::kUpstream),
      in_(creator ? CudaIpcBuffer::kUpstream : CudaIpcBuffer::kDownstream),
      chunk_bytes_(buffer_->ring_bytes() / 2),
      writer_(buffer_->ring_bytes()),
      assembler_(std::move(job_id), epoch, buffer_->ring_bytes(),
                 buffer_->ring_bytes() / 2) {}

absl::StatusOr<gpipe::v1::ShmSlot> CudaIpcChannel::Reserve(int64_t length) {
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<gpipe::v1::ShmSlot> slot;
  released_.wait(lock, [&] {
    if (!closed_.ok()) return true;
    if (reserved_ - freed_ >= kCudaIpcEvents) return false;
    slot = writer_.TryReserve(length);
    return slot.has_value();
  });
  if (!closed_.ok()) return closed_;
  ++reserved_;
  return *slot;
}

absl::Status CudaIpcChannel::Write(const gpipe::v1::ShmSlot& slot,
                                   const void* src) {
  return buffer_->CopyIn(out_, slot.offset(), src, slot.length(),
                         slot.sequence());
}

absl::Status CudaIpcChannel::Release(int64_t sequence) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = writer_.Release(sequence);
  if (s.ok()) ++freed_;
  released_.notify_all();
  return s;
}

absl::Status CudaIpcChannel::ReadChunk(const gpipe::v1::ShmSlot& slot,
                                       void* dst) {
  RETURN_IF_ERROR(
      buffer_->AwaitSenderCopy(in_, slot.sequence(), [this]() -> absl::Status {
        std::lock_guard<std::mutex> lock(mu_);
        return closed_;
      }));
  RETURN_IF_ERROR(buffer_->CopyOut(in_, slot.offset(), dst, slot.length(),
                                   slot.sequence()));
  return buffer_->MarkCopiedOut(slot.sequence());
}

void CudaIpcChannel::Close(absl::Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_.ok()) closed_ = std::move(why);
  released_.notify_all();
}

}  // namespace gpipe
