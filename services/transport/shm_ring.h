// The bookkeeping of one direction's ring in a shared-memory segment, kept
// by each side on its own. The writer places chunks first-fit (64-byte
// aligned) and frees each one when the reader gives it back, in any order:
// a receiver may keep a chunk as the storage of a tensor (an activation
// held until the backward pass) while later ones come and go. The reader
// checks every chunk the writer posts before it touches a byte: the next
// sequence, inside the ring, no overlap with a chunk it still uses.
#ifndef GPIPE_SERVICES_TRANSPORT_SHM_RING_H_
#define GPIPE_SERVICES_TRANSPORT_SHM_RING_H_

#include <cstdint>
#include <map>
#include <optional>

#include "absl/status/status.h"

namespace gpipe {

// One chunk of a ring: bytes [offset, offset + length), of which the first
// header_bytes are the serialized frame fields and the rest the payload.
struct ShmChunk {
  int64_t sequence = 0, offset = 0, length = 0, header_bytes = 0;
};

// Chunks start at multiples of this (cache lines; float payloads aligned).
inline constexpr int64_t kShmAlignment = 64;
// The frame fields before a payload may take at most this many bytes.
inline constexpr int64_t kMaxShmHeaderBytes = 64 << 10;

inline int64_t ShmAlignUp(int64_t n) {
  return (n + kShmAlignment - 1) / kShmAlignment * kShmAlignment;
}

class ShmRingWriter {
 public:
  // `max_in_use`: how many chunks may be unreleased at once.
  ShmRingWriter(int64_t capacity, int64_t max_in_use);
  // A place for `length` bytes (0 < length <= capacity), or nullopt while
  // no free range is large enough or max_in_use chunks are in use (wait
  // for Release and try again). header_bytes is left 0.
  std::optional<ShmChunk> TryReserve(int64_t length);
  // The reader is done with chunk `sequence`: INVALID_ARGUMENT (and nothing
  // freed) unless it is in use.
  absl::Status Release(int64_t sequence);
  int64_t chunks_in_use() const { return static_cast<int64_t>(used_.size()); }
  int64_t bytes_in_use() const { return bytes_in_use_; }
  int64_t capacity() const { return capacity_; }

 private:
  const int64_t capacity_, max_in_use_;
  std::map<int64_t, int64_t> free_;  // offset -> length, coalesced
  struct Used {
    int64_t offset, length;
  };
  std::map<int64_t, Used> used_;  // by sequence
  int64_t bytes_in_use_ = 0;
  int64_t next_sequence_ = 0;
};

class ShmRingReader {
 public:
  // Chunks are at most `max_chunk` bytes; at most `max_in_use` of them may
  // be accepted and not yet released.
  ShmRingReader(int64_t capacity, int64_t max_chunk, int64_t max_in_use);
  // Checks that `c` is the next chunk (sequence), lies inside the ring with
  // a length in (0, max_chunk] and a header in (0, min(length,
  // kMaxShmHeaderBytes)], is aligned, and overlaps no chunk still in use;
  // then marks it in use. Anything else is INVALID_ARGUMENT naming what is
  // wrong, and leaves the reader where it was.
  absl::Status Accept(const ShmChunk& c);
  // This side is done with chunk `sequence`; INVALID_ARGUMENT unless in use.
  absl::Status Release(int64_t sequence);
  int64_t chunks_in_use() const {
    return static_cast<int64_t>(by_sequence_.size());
  }

 private:
  const int64_t capacity_, max_chunk_, max_in_use_;
  std::map<int64_t, int64_t> by_offset_;    // offset -> end, in use
  std::map<int64_t, int64_t> by_sequence_;  // sequence -> offset, in use
  int64_t next_sequence_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_SHM_RING_H_
