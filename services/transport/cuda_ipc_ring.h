// The bookkeeping of one direction's ring in the CUDA IPC plane's exported
// device buffer, kept by each side on its own (nothing in the buffer but
// the bytes; the descriptors travel in frames): the writer
// places chunks one after another, wrapping to the start when a chunk would
// not fit before the end, and frees them when the reader gives them back in
// order; the reader mirrors the same placement rule, so it knows exactly
// which (offset, length, sequence) may come next and rejects anything else.
#ifndef GPIPE_SERVICES_TRANSPORT_CUDA_IPC_RING_H_
#define GPIPE_SERVICES_TRANSPORT_CUDA_IPC_RING_H_

#include <cstdint>
#include <deque>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpipe/v1/stage.pb.h"

namespace gpipe {

class CudaIpcRingWriter {
 public:
  explicit CudaIpcRingWriter(int64_t capacity) : capacity_(capacity) {}
  // A slot for `length` bytes (0 < length <= capacity), or nullopt while the
  // ring is too full (wait for Release and try again).
  std::optional<gpipe::v1::ShmSlot> TryReserve(int64_t length);
  // The reader is done with the slot of `sequence`: it must be the oldest
  // one in use, else INVALID_ARGUMENT (and nothing is freed).
  absl::Status Release(int64_t sequence);
  int64_t in_use() const { return head_ - tail_; }
  int64_t capacity() const { return capacity_; }

 private:
  struct Used {
    int64_t sequence, end;
  };
  const int64_t capacity_;
  int64_t head_ = 0, tail_ = 0;  // bytes placed / freed since the start
  int64_t next_sequence_ = 0;
  std::deque<Used> used_;
};

class CudaIpcRingReader {
 public:
  CudaIpcRingReader(int64_t capacity, int64_t max_chunk)
      : capacity_(capacity), max_chunk_(max_chunk) {}
  // Checks that `slot` is exactly the next chunk the writer can have placed
  // (sequence, offset, and a length in (0, max_chunk]) and advances; returns
  // its offset in the ring. Garbage, truncated, out-of-range or replayed
  // slots are INVALID_ARGUMENT and leave the reader where it was.
  absl::StatusOr<int64_t> Accept(const gpipe::v1::ShmSlot& slot);

 private:
  const int64_t capacity_, max_chunk_;
  int64_t head_ = 0;
  int64_t next_sequence_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_CUDA_IPC_RING_H_
