// Both directions of the shared-memory plane as one end of a link sees
// them: the ring it writes (blocking while full: back-pressure) and the ring
// it reads (every descriptor checked before a byte is touched). The gRPC
// stream around it carries the descriptors and the releases.
#ifndef GPIPE_SERVICES_TRANSPORT_SHM_CHANNEL_H_
#define GPIPE_SERVICES_TRANSPORT_SHM_CHANNEL_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpipe/v1/stage.pb.h"
#include "services/transport/shm_ring.h"
#include "services/transport/shm_segment.h"

namespace gpipe {

class ShmChannel {
 public:
  // `creator`: this end created the segment (the upstream stage) and
  // writes the downstream ring. Chunks are at most `chunk_bytes`.
  ShmChannel(std::unique_ptr<ShmSegment> segment, bool creator,
             int64_t chunk_bytes);

  int64_t chunk_bytes() const { return chunk_bytes_; }

  // Writing: a slot for `length` bytes, waiting while the ring is full;
  // fails once Close was called.
  absl::StatusOr<gpipe::v1::ShmSlot> Reserve(int64_t length);
  char* Data(const gpipe::v1::ShmSlot& slot) const {
    return out_ + slot.offset();
  }
  // The peer released `sequence` (it must be the oldest in use).
  absl::Status Release(int64_t sequence);

  // Reading: the bytes of the peer's chunk `slot`, once it checks out.
  absl::StatusOr<const char*> Accept(const gpipe::v1::ShmSlot& slot);

  // Wakes and fails every Reserve, now and later.
  void Close(absl::Status why);

 private:
  std::unique_ptr<ShmSegment> segment_;
  char* out_;
  const char* in_;
  const int64_t chunk_bytes_;
  std::mutex mu_;
  std::condition_variable released_;
  ShmRingWriter writer_;
  absl::Status closed_;
  ShmRingReader reader_;  // the reading thread's alone
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_SHM_CHANNEL_H_
