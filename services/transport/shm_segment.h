// A shared-memory segment between two processes on one host: an anonymous
// memfd that the creating stage maps and offers, and the peer opens through
// /proc/PID/fd/N and maps. It never has a name in any file system, so a
// process killed with -9 leaks nothing: the memory goes when the last
// mapping does. The segment holds a small header (a nonce from each side,
// which proves both map the same memory, and one pair of notification
// queues per direction) and two rings, one per direction.
#ifndef GPIPE_SERVICES_TRANSPORT_SHM_SEGMENT_H_
#define GPIPE_SERVICES_TRANSPORT_SHM_SEGMENT_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace gpipe {

// Header bytes before the rings (one page keeps the rings page-aligned).
inline constexpr int64_t kShmHeaderBytes = 4096;

// Chunks of one direction that may be in use at once (posted and not yet
// released): the size of both notification queues below.
inline constexpr uint32_t kShmQueueSlots = 32;

// One chunk as the writer posts it in the segment: where it lies in the
// ring, and how many of its bytes are the serialized frame fields that
// precede the payload. The reader copies it out before checking it.
struct ShmPostedChunk {
  std::atomic<int64_t> sequence, offset, length, header_bytes;
};

// The notifications of one direction, in the shared header: the writer
// fills descriptors[n % kShmQueueSlots] and then bumps `posted` to n + 1
// (release); the reader gives chunks back the same way through `releases`
// and `released`. Both counters are futex words: a side that waits for the
// other sleeps on them (shm_futex.h), and a bump wakes it, only when the
// matching sleepers count says someone may sleep (a wake is a system call).
struct ShmQueues {
  alignas(64) std::atomic<uint32_t> posted;
  std::atomic<uint32_t> posted_sleepers;
  alignas(64) std::atomic<uint32_t> released;
  std::atomic<uint32_t> released_sleepers;
  alignas(64) ShmPostedChunk descriptors[kShmQueueSlots];
  std::atomic<int64_t> releases[kShmQueueSlots];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
              sizeof(std::atomic<uint32_t>) == 4);

// The size of a segment with two rings of `ring_bytes`.
inline int64_t ShmSegmentBytes(int64_t ring_bytes) {
  return kShmHeaderBytes + 2 * ring_bytes;
}

// The largest ring, a power of two from kMinShmRingBytes up to `most`, whose
// segment fits in `room` bytes; 0 when not even the smallest does.
int64_t ShmRingFitting(int64_t room, int64_t most);

class ShmSegment {
 public:
  // Which ring a side writes: the creator (upstream stage) writes
  // kDownstream, the opener kUpstream.
  enum Ring { kDownstream = 0, kUpstream = 1 };

  // A new segment with two rings of `ring_bytes`, `nonce` in its header.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(int64_t ring_bytes,
                                                            uint64_t nonce);
  // Maps the segment that process `pid` holds as descriptor `fd`; checks its
  // size and that its header carries `nonce`, then writes `answer_nonce`.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> OpenPeer(
      int64_t pid, int64_t fd, int64_t ring_bytes, uint64_t nonce,
      uint64_t answer_nonce);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int fd() const { return fd_; }  // the creator's, until CloseFd
  // Drops the descriptor once the peer has mapped (or refused) the segment.
  void CloseFd();
  int64_t ring_bytes() const { return ring_bytes_; }
  int64_t bytes() const { return bytes_; }  // both rings and the header
  char* ring(Ring r) const { return base_ + kShmHeaderBytes + r * ring_bytes_; }
  // The notification queues of the ring `r` (written by that ring's writer).
  ShmQueues* queues(Ring r) const;
  // The opener's nonce as the creator sees it in the shared header.
  uint64_t answer_nonce() const;

 private:
  ShmSegment(char* base, int64_t bytes, int fd, int64_t ring_bytes)
      : base_(base), bytes_(bytes), fd_(fd), ring_bytes_(ring_bytes) {}
  char* base_;
  int64_t bytes_;
  int fd_;
  int64_t ring_bytes_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_SHM_SEGMENT_H_
