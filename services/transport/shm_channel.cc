#include "services/transport/shm_channel.h"

namespace gpipe {

ShmChannel::ShmChannel(std::unique_ptr<ShmSegment> segment, bool creator,
                       int64_t chunk_bytes)
    : segment_(std::move(segment)),
      out_(segment_->ring(creator ? ShmSegment::kDownstream
                                  : ShmSegment::kUpstream)),
      in_(segment_->ring(creator ? ShmSegment::kUpstream
                                 : ShmSegment::kDownstream)),
      chunk_bytes_(chunk_bytes),
      writer_(segment_->ring_bytes()),
      reader_(segment_->ring_bytes(), segment_->ring_bytes() / 2) {}

absl::StatusOr<gpipe::v1::ShmSlot> ShmChannel::Reserve(int64_t length) {
  std::unique_lock<std::mutex> lock(mu_);
  std::optional<gpipe::v1::ShmSlot> slot;
  released_.wait(lock, [&] {
    if (!closed_.ok()) return true;
    slot = writer_.TryReserve(length);
    return slot.has_value();
  });
  if (!closed_.ok()) return closed_;
  return *slot;
}

absl::Status ShmChannel::Release(int64_t sequence) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = writer_.Release(sequence);
  released_.notify_all();
  return s;
}

absl::StatusOr<const char*> ShmChannel::Accept(const gpipe::v1::ShmSlot& slot) {
  absl::StatusOr<int64_t> offset = reader_.Accept(slot);
  if (!offset.ok()) return offset.status();
  return in_ + *offset;
}

void ShmChannel::Close(absl::Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_.ok()) closed_ = std::move(why);
  released_.notify_all();
}

}  // namespace gpipe
