// Both directions of the shared-memory plane as one end of a link sees
// them. Writing: reserve a chunk of the ring this end writes (blocking
// while it is full: back-pressure), fill it, post it in the segment's
// queue and wake the peer. Reading: wait in the segment for the peer's next
// chunk, check it before touching a byte, and give it back when done
// (right away after a copy, or when the tensor that keeps the chunk as its
// storage is freed). No gRPC frame per chunk: the stream around it only
// negotiates, and its end (a finished or killed peer) closes the channel.
#ifndef GPIPE_SERVICES_TRANSPORT_SHM_CHANNEL_H_
#define GPIPE_SERVICES_TRANSPORT_SHM_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/transport/shm_ring.h"
#include "services/transport/shm_segment.h"

namespace gpipe {

class ShmChannel {
 public:
  // `creator`: this end created the segment (the upstream stage) and
  // writes the downstream ring. Payloads are split into chunks of at most
  // `chunk_bytes` (and at most an eighth of the ring, see TryHold).
  ShmChannel(std::unique_ptr<ShmSegment> segment, bool creator,
             int64_t chunk_bytes);

  int64_t chunk_bytes() const { return chunk_bytes_; }
  // The segment's size, both rings and the header: memory this end maps.
  int64_t segment_bytes() const {
    return ShmSegmentBytes(segment_->ring_bytes());
  }

  // Writing, one thread at a time. A chunk of `length` bytes, waiting
  // while the ring is full; fails once closed, or (INVALID_ARGUMENT) when
  // the peer gives back chunks that are not in use.
  absl::StatusOr<ShmChunk> Reserve(int64_t length);
  char* Data(const ShmChunk& c) const { return out_ + c.offset; }
  // Publishes a filled chunk (its header_bytes set) and wakes the peer.
  void Post(const ShmChunk& c);

  // Reading, one thread. The peer's next chunk once it checks out
  // (ShmRingReader::Accept), waiting for it; nullopt once the channel is
  // closed (with `drain`: once every chunk posted before was read). An
  // error is always a chunk that failed a check.
  absl::StatusOr<std::optional<ShmChunk>> Next();
  const char* InData(const ShmChunk& c) const { return in_ + c.offset; }
  // Whether a received chunk of `bytes` may stay in the ring as a tensor's
  // storage: at most kMaxHeldChunks chunks and a quarter of the ring are
  // held at once, so the writer always finds room for its next chunk and
  // a stage that keeps activations for the backward pass cannot stall its
  // neighbour (beyond that, chunks are copied out). Counts it when true.
  bool TryHold(int64_t bytes);
  // This end is done with the peer's chunk `sequence` (`held_bytes`: what
  // TryHold counted for it, or 0). Any thread, also after Close: the
  // segment stays mapped while this channel lives.
  void GiveBack(int64_t sequence, int64_t held_bytes);

  // Wakes and fails every Reserve and Next, now and later (`drain`: Next
  // first returns what the peer posted before, e.g. before it finished).
  void Close(absl::Status why, bool drain);

  bool closed() const { return closed_.load(); }

  static constexpr int64_t kMaxHeldChunks = 4;

 private:
  absl::Status DrainReleasesLocked();

  std::unique_ptr<ShmSegment> segment_;
  char* out_;
  const char* in_;
  ShmQueues* out_queues_;  // the ring this end writes
  ShmQueues* in_queues_;   // the ring the peer writes
  const int64_t chunk_bytes_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> drain_{false};

  mutable std::mutex mu_;  // everything below
  absl::Status why_closed_;
  ShmRingWriter writer_;
  uint32_t posted_ = 0;         // chunks this end posted
  uint32_t releases_seen_ = 0;  // of the peer's releases
  ShmRingReader reader_;
  uint32_t read_ = 0;             // of the peer's posted chunks
  uint32_t releases_posted_ = 0;  // releases this end posted
  int64_t held_chunks_ = 0, held_bytes_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_SHM_CHANNEL_H_
