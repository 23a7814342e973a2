#include "services/transport/shm_channel.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "services/transport/shm_futex.h"

namespace gpipe {
namespace {

// How long one sleep on a futex lasts at most: a missed wake or a closed
// link costs no more than this.
constexpr auto kPoll = std::chrono::milliseconds(50);

}  // namespace

ShmChannel::ShmChannel(std::unique_ptr<ShmSegment> segment, bool creator,
                       int64_t chunk_bytes)
    : segment_(std::move(segment)),
      out_(segment_->ring(creator ? ShmSegment::kDownstream
                                  : ShmSegment::kUpstream)),
      in_(segment_->ring(creator ? ShmSegment::kUpstream
                                 : ShmSegment::kDownstream)),
      out_queues_(segment_->queues(creator ? ShmSegment::kDownstream
                                           : ShmSegment::kUpstream)),
      in_queues_(segment_->queues(creator ? ShmSegment::kUpstream
                                          : ShmSegment::kDownstream)),
      chunk_bytes_(std::min(chunk_bytes, segment_->ring_bytes() / 8)),
      writer_(segment_->ring_bytes(), kShmQueueSlots),
      // The peer's chunk size is its own option: accept up to half the ring.
      reader_(segment_->ring_bytes(), segment_->ring_bytes() / 2,
              kShmQueueSlots) {}

absl::Status ShmChannel::DrainReleasesLocked() {
  const uint32_t released =
      out_queues_->released.load(std::memory_order_acquire);
  const uint32_t n = released - releases_seen_;
  if (n > kShmQueueSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared memory: the peer announces ", n,
                     " releases at once, more than the ", kShmQueueSlots,
                     " chunks that can be in use"));
  }
  for (; releases_seen_ != released; ++releases_seen_) {
    const int64_t sequence =
        out_queues_->releases[releases_seen_ % kShmQueueSlots].load(
            std::memory_order_relaxed);
    if (absl::Status s = writer_.Release(sequence); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<ShmChunk> ShmChannel::Reserve(int64_t length) {
  for (;;) {
    uint32_t seen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!why_closed_.ok()) return why_closed_;
      if (absl::Status s = DrainReleasesLocked(); !s.ok()) {
        why_closed_ = s;
        closed_ = true;
        return s;
      }
      if (std::optional<ShmChunk> c = writer_.TryReserve(length)) return *c;
      seen = out_queues_->released.load(std::memory_order_acquire);
      if (seen != releases_seen_) continue;  // released meanwhile
    }
    SleepWhile(&out_queues_->released, &out_queues_->released_sleepers, seen,
               kPoll);
  }
}

void ShmChannel::Post(const ShmChunk& c) {
  ShmPostedChunk& d = out_queues_->descriptors[posted_ % kShmQueueSlots];
  d.sequence.store(c.sequence, std::memory_order_relaxed);
  d.offset.store(c.offset, std::memory_order_relaxed);
  d.length.store(c.length, std::memory_order_relaxed);
  d.header_bytes.store(c.header_bytes, std::memory_order_relaxed);
  // The chunk's bytes and its descriptor happen before the count the peer
  // acquires.
  Bump(&out_queues_->posted, &out_queues_->posted_sleepers, ++posted_);
}

absl::StatusOr<std::optional<ShmChunk>> ShmChannel::Next() {
  for (;;) {
    const bool closed = closed_.load();
    const uint32_t posted = in_queues_->posted.load(std::memory_order_acquire);
    if (posted != read_ && (!closed || drain_.load())) {
      if (posted - read_ > kShmQueueSlots) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shared memory: the peer announces ", posted - read_,
            " chunks at once, more than the ", kShmQueueSlots, " it may use"));
      }
      // Copied out of shared memory once, then checked: the peer cannot
      // change what was checked.
      const ShmPostedChunk& d = in_queues_->descriptors[read_ % kShmQueueSlots];
      ShmChunk c;
      c.sequence = d.sequence.load(std::memory_order_relaxed);
      c.offset = d.offset.load(std::memory_order_relaxed);
      c.length = d.length.load(std::memory_order_relaxed);
      c.header_bytes = d.header_bytes.load(std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(mu_);
      if (absl::Status s = reader_.Accept(c); !s.ok()) return s;
      ++read_;
      return std::optional<ShmChunk>(c);
    }
    if (closed) return std::optional<ShmChunk>();
    SleepWhile(&in_queues_->posted, &in_queues_->posted_sleepers, posted,
               kPoll);
  }
}

bool ShmChannel::TryHold(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_chunks_ >= kMaxHeldChunks ||
      held_bytes_ + bytes > segment_->ring_bytes() / 4) {
    return false;
  }
  ++held_chunks_;
  held_bytes_ += bytes;
  return true;
}

void ShmChannel::GiveBack(int64_t sequence, int64_t held_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_bytes > 0) {
    --held_chunks_;
    held_bytes_ -= held_bytes;
  }
  if (!reader_.Release(sequence).ok()) return;  // given back twice: ours
  in_queues_->releases[releases_posted_ % kShmQueueSlots].store(
      sequence, std::memory_order_relaxed);
  Bump(&in_queues_->released, &in_queues_->released_sleepers,
       ++releases_posted_);
}

void ShmChannel::Close(absl::Status why, bool drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!why_closed_.ok()) return;
    why_closed_ = why.ok() ? absl::CancelledError("link closed") : why;
    drain_ = drain;
    closed_ = true;
  }
  // Wakes this process's waiters (and, harmlessly, the peer's).
  FutexWakeAll(&in_queues_->posted);
  FutexWakeAll(&out_queues_->released);
}

}  // namespace gpipe
