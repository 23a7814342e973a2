// Both directions of the CUDA IPC plane as one end of a link sees them: the
// device ring it writes (blocking while full, or while kCudaIpcEvents chunks
// are in flight: back-pressure) and the ring it reads (every descriptor
// checked by a CudaIpcAssembler before a byte is touched). The gRPC stream
// around it carries descriptors and CUDA_IPC_RELEASEs; the bytes go device
// to device and never through the host.
#ifndef GPIPE_SERVICES_TRANSPORT_CUDA_IPC_CHANNEL_H_
#define GPIPE_SERVICES_TRANSPORT_CUDA_IPC_CHANNEL_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpipe/v1/stage.pb.h"
#include "services/tensor/tensor.h"
#include "services/transport/cuda_ipc_buffer.h"
#include "services/transport/cuda_ipc_plane.h"
#include "services/transport/cuda_ipc_ring.h"

namespace gpipe {

class CudaIpcChannel {
 public:
  // `creator`: this end created the buffer (the upstream stage) and writes
  // its downstream ring. Chunks are at most half a ring.
  CudaIpcChannel(std::unique_ptr<CudaIpcBuffer> buffer, bool creator,
                 std::string job_id, int64_t epoch);

  int64_t chunk_bytes() const { return chunk_bytes_; }

  // Writing: a slot for `length` bytes, waiting while the ring is full;
  // fails once Close was called.
  absl::StatusOr<gpipe::v1::ShmSlot> Reserve(int64_t length);
  // Copies `slot.length()` bytes from `src` into the slot (see
  // CudaIpcBuffer::CopyIn for the ordering).
  absl::Status Write(const gpipe::v1::ShmSlot& slot, const void* src);
  // The peer released `sequence` (it must be the oldest in use).
  absl::Status Release(int64_t sequence);

  // Reading, on the link's reader thread: checks one descriptor frame.
  absl::StatusOr<CudaIpcChunk> Accept(const gpipe::v1::Frame& frame) {
    return assembler_.Add(frame);
  }
  // Reading, on the receiving stage's thread: waits on the host for the
  // sender's copy of the accepted chunk `slot` (returning Close's reason if
  // the link closes first, so a dead sender cannot hang the stage), then
  // queues its copy to the device memory `dst` on the thread's current
  // stream, and returns without waiting for that copy.
  absl::Status ReadChunk(const gpipe::v1::ShmSlot& slot, void* dst);
  // Reading, from any thread: waits until the copy ReadChunk queued for
  // chunk `sequence` is done; the chunk may be released then.
  absl::Status AwaitCopiedOut(int64_t sequence) const {
    return buffer_->AwaitCopiedOut(sequence);
  }

  // Wakes and fails every Reserve, now and later.
  void Close(absl::Status why);

 private:
  std::unique_ptr<CudaIpcBuffer> buffer_;
  const CudaIpcBuffer::Ring out_, in_;
  const int64_t chunk_bytes_;
  std::mutex mu_;
  std::condition_variable released_;
  CudaIpcRingWriter writer_;
  int64_t reserved_ = 0, freed_ = 0;  // chunks, for the events in flight
  absl::Status closed_;
  CudaIpcAssembler assembler_;  // the reading thread's alone
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_CUDA_IPC_CHANNEL_H_
