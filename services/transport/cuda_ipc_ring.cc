#include "services/transport/cuda_ipc_ring.h"

#include "absl/strings/str_cat.h"

namespace gpipe {
namespace {

// Where a chunk of `length` placed at `head` starts (in bytes since the
// start): the same position unless it would run past the ring's end, then
// the next lap's start.
int64_t PlaceAt(int64_t head, int64_t length, int64_t capacity) {
  const int64_t pos = head % capacity;
  return pos + length > capacity ? head + (capacity - pos) : head;
}

}  // namespace

std::optional<gpipe::v1::ShmSlot> CudaIpcRingWriter::TryReserve(
    int64_t length) {
  if (length <= 0 || length > capacity_) return std::nullopt;
  const int64_t start = PlaceAt(head_, length, capacity_);
  if (start + length - tail_ > capacity_) return std::nullopt;
  head_ = start + length;
  gpipe::v1::ShmSlot slot;
  slot.set_offset(start % capacity_);
  slot.set_length(length);
  slot.set_sequence(next_sequence_++);
  used_.push_back({slot.sequence(), head_});
  return slot;
}

absl::Status CudaIpcRingWriter::Release(int64_t sequence) {
  if (used_.empty() || used_.front().sequence != sequence) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory: release of chunk ", sequence, " but ",
        used_.empty()
            ? std::string("none is in use")
            : absl::StrCat("the oldest in use is ", used_.front().sequence)));
  }
  tail_ = used_.front().end;
  used_.pop_front();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaIpcRingReader::Accept(const gpipe::v1::ShmSlot& s) {
  if (s.sequence() != next_sequence_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: descriptor of chunk ", s.sequence(),
                     " where chunk ", next_sequence_, " comes next"));
  }
  if (s.length() <= 0 || s.length() > max_chunk_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: chunk length ", s.length(),
                     " is not in (0, ", max_chunk_, "]"));
  }
  if (s.offset() < 0 || s.offset() > capacity_ - s.length()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: chunk [", s.offset(), ", +", s.length(),
                     ") lies outside the ring of ", capacity_, " bytes"));
  }
  const int64_t start = PlaceAt(head_, s.length(), capacity_);
  if (s.offset() != start % capacity_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory: chunk ", s.sequence(), " at offset ", s.offset(),
        " where the writer places it at ", start % capacity_));
  }
  head_ = start + s.length();
  ++next_sequence_;
  return s.offset();
}

}  // namespace gpipe
