// What the CUDA IPC data plane decides on the CPU, without touching a GPU:
// the layout of the exported device buffer, whether an offer can be taken
// at all (same host, same GPU, sane sizes), and the checks on every
// descriptor a peer sends (fencing, tensor header against its byte count,
// each chunk exactly where the sender's ring can have put it). Kept apart
// from the CUDA calls (cuda_ipc_buffer.h) so that it is tested without a GPU.
#ifndef GPIPE_SERVICES_TRANSPORT_CUDA_IPC_PLANE_H_
#define GPIPE_SERVICES_TRANSPORT_CUDA_IPC_PLANE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/stage.pb.h"
#include "services/tensor/shape.h"
#include "services/transport/cuda_ipc_ring.h"
#include "services/transport/data_plane.h"
#include "services/transport/frame_codec.h"
#include "services/transport/link.h"

namespace gpipe {

// Interprocess events per direction: chunk `sequence` is ordered by event
// sequence % kCudaIpcEvents, so at most this many chunks are in flight.
inline constexpr int kCudaIpcEvents = 16;
// Bytes of cudaIpcMemHandle_t / cudaIpcEventHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr int kCudaIpcHandleBytes = 64;
// The buffer's header: the offerer's nonce at 0, the answer's at 8; the
// rings start aligned after it.
inline constexpr int64_t kCudaIpcHeaderBytes = 256;
inline int64_t CudaIpcBufferBytes(int64_t ring_bytes) {
  return kCudaIpcHeaderBytes + 2 * ring_bytes;
}

// Why the answering side cannot take `offer` before trying to open it ("" when
// nothing speaks against it): another host, no GPU here (`local_uuid`
// empty), another GPU, sizes out of bounds, malformed handles.
std::string CudaIpcOfferMismatch(const gpipe::v1::CudaIpcOffer& offer,
                                 const HostIdentity& here,
                                 const std::string& local_uuid);

// One checked descriptor: a chunk of a device tensor in the peer's ring,
// waiting to be copied out by the receiving stage.
struct CudaIpcChunk {
  // The tensor's first chunk: `message` (kind, step, micro-batch; no tensor
  // yet), `shape` and `dtype` say what it is.
  bool first = false;
  bool last = false;  // its last chunk
  Message message;
  Shape shape;
  DType dtype = DType::kF32;
  gpipe::v1::ShmSlot slot;  // offset in the ring, length, sequence
};

// Checks the descriptors of one direction's ring, tensor by tensor.
// Every frame is checked before it counts: job and epoch
// (FAILED_PRECONDITION), the header against its byte count, chunks that run
// past the announced size or end short, and each slot against the ring's
// placement rule (offset, length in (0, max_chunk], sequence): anything
// else is INVALID_ARGUMENT and leaves the assembler where it was.
class CudaIpcAssembler {
 public:
  CudaIpcAssembler(std::string job_id, int64_t epoch, int64_t ring_bytes,
                   int64_t max_chunk)
      : job_id_(std::move(job_id)),
        epoch_(epoch),
        ring_(ring_bytes, max_chunk) {}
  absl::StatusOr<CudaIpcChunk> Add(const gpipe::v1::Frame& frame);

 private:
  std::string job_id_;
  int64_t epoch_;
  CudaIpcRingReader ring_;
  bool in_tensor_ = false;
  Message partial_;  // the tensor's routing fields
  int64_t expected_ = 0, received_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_CUDA_IPC_PLANE_H_
