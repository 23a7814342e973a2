// The device side of the CUDA IPC plane: one cudaMalloc allocation (a header
// with the nonces, then a ring per direction) and 2 x kCudaIpcEvents
// interprocess events (plus kCudaIpcEvents local ones that mark the copies
// out), made and exported once by the upstream stage and
// opened once by the downstream stage; and the device-to-device copies in
// and out of the rings. Nothing here includes CUDA headers; without the CUDA
// backend (or a GPU) Create and Open fail with FAILED_PRECONDITION.
#ifndef GPIPE_SERVICES_TRANSPORT_CUDA_IPC_BUFFER_H_
#define GPIPE_SERVICES_TRANSPORT_CUDA_IPC_BUFFER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpipe/v1/stage.pb.h"

namespace gpipe {

// The UUID (16 bytes, cudaDeviceProp.uuid) of this thread's current GPU, or
// "" when there is none (or no CUDA backend). Initializes CUDA.
std::string CurrentGpuUuid();

class CudaIpcBuffer {
 public:
  // Which ring a side writes: the creator (upstream stage) kDownstream.
  enum Ring { kDownstream = 0, kUpstream = 1 };

  // A new buffer with two rings of `ring_bytes` and `nonce` in its header;
  // fills `offer` with everything the peer needs to open it.
  static absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> Create(
      int64_t ring_bytes, uint64_t nonce, gpipe::v1::CudaIpcOffer* offer);
  // Opens the peer's buffer and events, reads its nonce back through the
  // mapping (the probe: only a process that really maps it can), then
  // writes `answer_nonce` into the header.
  static absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> Open(
      const gpipe::v1::CudaIpcOffer& offer, uint64_t answer_nonce);

  ~CudaIpcBuffer();
  CudaIpcBuffer(const CudaIpcBuffer&) = delete;
  CudaIpcBuffer& operator=(const CudaIpcBuffer&) = delete;

  int64_t ring_bytes() const;
  // The creator: the answer nonce the peer wrote (0 when none).
  absl::StatusOr<uint64_t> ReadAnswerNonce() const;

  // Sending chunk `sequence`: copies `bytes` from `src` (device memory, or
  // host memory) to `offset` of ring `r` on the buffer's copy stream, after
  // the work queued so far on the thread's current stream, and records the
  // chunk's event; later work on the current stream waits for the copy, so
  // `src` may be reused by it.
  absl::Status CopyIn(Ring r, int64_t offset, const void* src, int64_t bytes,
                      int64_t sequence);
  // Receiving chunk `sequence`: waits on the host, polling, until the
  // sender's copy into the ring has finished, and returns early with what
  // `abandoned` returns once that is not OK (the link closed: the sender
  // may have died with its copy still queued, and a stream made to wait for
  // an event that never completes could not be woken). Call before CopyOut.
  absl::Status AwaitSenderCopy(
      Ring r, int64_t sequence,
      const std::function<absl::Status()>& abandoned) const;
  // Receiving chunk `sequence`: on the thread's current stream, waits for
  // the sender's event, then copies `bytes` at `offset` of ring `r` to the
  // device memory `dst`.
  absl::Status CopyOut(Ring r, int64_t offset, void* dst, int64_t bytes,
                       int64_t sequence);
  // Receiving chunk `sequence`: marks the end of its copy out on the
  // thread's current stream (call after CopyOut).
  absl::Status MarkCopiedOut(int64_t sequence);
  // Blocks, sleeping, until the copy out marked for `sequence` is done: the
  // chunk may be released then. From any thread; it waits for this
  // process's own stream only (whose wait for the sender's copy
  // AwaitSenderCopy has seen end), so a dead peer cannot hang it.
  absl::Status AwaitCopiedOut(int64_t sequence) const;

 private:
  struct State;
  explicit CudaIpcBuffer(std::unique_ptr<State> s);
  std::unique_ptr<State> s_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_CUDA_IPC_BUFFER_H_
