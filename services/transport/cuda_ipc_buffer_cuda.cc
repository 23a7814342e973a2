// The CUDA IPC plane with the CUDA runtime. Every failure is a status, not
// an abort: a peer that cannot open a handle makes the link fall back (or
// fail clearly), it must not take the worker down.
#include <cuda_runtime.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/tensor/cuda/runtime.h"
#include "services/tensor/fake_device.h"
#include "services/transport/cuda_ipc_buffer.h"
#include "services/transport/cuda_ipc_plane.h"

namespace gpipe {
namespace {

absl::Status CudaError(cudaError_t e, const char* what) {
  cudaGetLastError();  // the non-sticky ones would fail the next call too
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

#define GPIPE_CUDA_RETURN_IF_ERROR(call, what)         \
  do {                                                 \
    const cudaError_t e_ = (call);                     \
    if (e_ != cudaSuccess) return CudaError(e_, what); \
  } while (0)

cudaStream_t Current() {
  return static_cast<cudaStream_t>(cuda::CurrentStream());
}

}  // namespace

struct CudaIpcBuffer::State {
  bool creator = false;
  char* base = nullptr;
  int64_t ring_bytes = 0;
  cudaEvent_t events[2 * kCudaIpcEvents] = {};
  // This process's own: the ends of its copies out, by chunk sequence.
  cudaEvent_t copied_out[kCudaIpcEvents] = {};
  cudaStream_t copy = nullptr;

  char* ring(Ring r) const {
    return base + kCudaIpcHeaderBytes + static_cast<int64_t>(r) * ring_bytes;
  }
  cudaEvent_t event(Ring r, int64_t sequence) const {
    return events[r * kCudaIpcEvents + sequence % kCudaIpcEvents];
  }

  // Blocking-sync events: the thread that waits for one sleeps instead of
  // spinning on a core the stages' compute threads need.
  absl::Status CreateCopiedOutEvents() {
    for (cudaEvent_t& e : copied_out) {
      GPIPE_CUDA_RETURN_IF_ERROR(
          cudaEventCreateWithFlags(
              &e, cudaEventDisableTiming | cudaEventBlockingSync),
          "cudaEventCreate (copies out)");
    }
    return absl::OkStatus();
  }

  ~State() {
    // Errors are ignored: at process exit the runtime may be gone already.
    if (copy != nullptr) {
      cudaStreamSynchronize(copy);
      cudaStreamDestroy(copy);
    }
    for (cudaEvent_t e : events)
      if (e != nullptr) cudaEventDestroy(e);
    for (cudaEvent_t e : copied_out)
      if (e != nullptr) cudaEventDestroy(e);
    if (base != nullptr) {
      if (creator) {
        cudaFree(base);
      } else {
        cudaIpcCloseMemHandle(base);
      }
    }
    cudaGetLastError();
  }
};

std::string CurrentGpuUuid() {
  // The fake device's tensors are host memory: nothing to export.
  if (FakeDeviceEnabled() || !cuda::DevicePresent()) return "";
  int device = 0;
  cudaDeviceProp p;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&p, device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  return std::string(p.uuid.bytes, sizeof(p.uuid.bytes));
}

CudaIpcBuffer::CudaIpcBuffer(std::unique_ptr<State> s) : s_(std::move(s)) {}
CudaIpcBuffer::~CudaIpcBuffer() = default;

absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> CudaIpcBuffer::Create(
    int64_t ring_bytes, uint64_t nonce, gpipe::v1::CudaIpcOffer* offer) {
  const std::string uuid = CurrentGpuUuid();
  if (uuid.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no GPU: ", cuda::DeviceDescription()));
  }
  auto s = std::make_unique<State>();
  s->creator = true;
  s->ring_bytes = ring_bytes;
  const int64_t bytes = CudaIpcBufferBytes(ring_bytes);
  void* base = nullptr;
  // Plain device memory: managed memory cannot be exported.
  GPIPE_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, static_cast<size_t>(bytes)),
                             "cudaMalloc of the CUDA IPC buffer");
  s->base = static_cast<char*>(base);
  GPIPE_CUDA_RETURN_IF_ERROR(cudaMemset(s->base, 0, kCudaIpcHeaderBytes),
                             "cudaMemset");
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(s->base, &nonce, sizeof(nonce), cudaMemcpyHostToDevice),
      "writing the nonce");
  // A copy from pageable memory may return before it lands: the peer reads
  // the nonce as soon as the offer reaches it.
  GPIPE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr),
                             "writing the nonce");
  cudaIpcMemHandle_t handle;
  GPIPE_CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&handle, s->base),
                             "cudaIpcGetMemHandle");
  offer->set_memory_handle(std::string(handle.reserved, sizeof(handle)));
  for (cudaEvent_t& e : s->events) {
    GPIPE_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(
            &e, cudaEventDisableTiming | cudaEventInterprocess),
        "cudaEventCreate (interprocess)");
    cudaIpcEventHandle_t eh;
    GPIPE_CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&eh, e),
                               "cudaIpcGetEventHandle");
    offer->add_event_handles(std::string(eh.reserved, sizeof(eh)));
  }
  RETURN_IF_ERROR(s->CreateCopiedOutEvents());
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&s->copy, cudaStreamNonBlocking),
      "cudaStreamCreate");
  offer->set_device_uuid(uuid);
  offer->set_ring_bytes(ring_bytes);
  offer->set_buffer_bytes(bytes);
  offer->set_nonce(nonce);
  return std::unique_ptr<CudaIpcBuffer>(new CudaIpcBuffer(std::move(s)));
}

absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> CudaIpcBuffer::Open(
    const gpipe::v1::CudaIpcOffer& offer, uint64_t answer_nonce) {
  if (offer.memory_handle().size() != sizeof(cudaIpcMemHandle_t) ||
      offer.event_handles_size() != 2 * kCudaIpcEvents) {
    return absl::InvalidArgumentError("a malformed CUDA IPC offer");
  }
  auto s = std::make_unique<State>();
  s->ring_bytes = offer.ring_bytes();
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, offer.memory_handle().data(), sizeof(handle));
  void* base = nullptr;
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess),
      "cudaIpcOpenMemHandle");
  s->base = static_cast<char*>(base);
  uint64_t nonce = 0;
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&nonce, s->base, sizeof(nonce), cudaMemcpyDeviceToHost),
      "reading the nonce through the mapping");
  if (nonce != offer.nonce()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the mapped device buffer holds nonce ", nonce,
                     ", the offer says ", offer.nonce()));
  }
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(s->base + sizeof(uint64_t), &answer_nonce,
                 sizeof(answer_nonce), cudaMemcpyHostToDevice),
      "writing the answer nonce");
  GPIPE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(nullptr),
                             "writing the answer nonce");
  for (int i = 0; i < 2 * kCudaIpcEvents; ++i) {
    const std::string& h = offer.event_handles(i);
    if (h.size() != sizeof(cudaIpcEventHandle_t)) {
      return absl::InvalidArgumentError("a malformed CUDA IPC event handle");
    }
    cudaIpcEventHandle_t eh;
    std::memcpy(&eh, h.data(), sizeof(eh));
    GPIPE_CUDA_RETURN_IF_ERROR(cudaIpcOpenEventHandle(&s->events[i], eh),
                               "cudaIpcOpenEventHandle");
  }
  RETURN_IF_ERROR(s->CreateCopiedOutEvents());
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&s->copy, cudaStreamNonBlocking),
      "cudaStreamCreate");
  return std::unique_ptr<CudaIpcBuffer>(new CudaIpcBuffer(std::move(s)));
}

int64_t CudaIpcBuffer::ring_bytes() const { return s_->ring_bytes; }

absl::StatusOr<uint64_t> CudaIpcBuffer::ReadAnswerNonce() const {
  uint64_t n = 0;
  GPIPE_CUDA_RETURN_IF_ERROR(cudaMemcpy(&n, s_->base + sizeof(uint64_t),
                                        sizeof(n), cudaMemcpyDeviceToHost),
                             "reading the answer nonce");
  return n;
}

absl::Status CudaIpcBuffer::CopyIn(Ring r, int64_t offset, const void* src,
                                   int64_t bytes, int64_t sequence) {
  cudaEvent_t done = s_->event(r, sequence);
  // The copy stream waits for the producer of `src` on the current stream:
  // the chunk's own event is free (its last use was released) and marks it.
  GPIPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, Current()),
                             "cudaEventRecord");
  GPIPE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s_->copy, done, 0),
                             "cudaStreamWaitEvent");
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(s_->ring(r) + offset, src, static_cast<size_t>(bytes),
                      cudaMemcpyDefault, s_->copy),
      "copy into the CUDA IPC ring");
  GPIPE_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, s_->copy),
                             "cudaEventRecord");
  GPIPE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(Current(), done, 0),
                             "cudaStreamWaitEvent");
  return absl::OkStatus();
}

absl::Status CudaIpcBuffer::AwaitSenderCopy(
    Ring r, int64_t sequence,
    const std::function<absl::Status()>& abandoned) const {
  cudaEvent_t done = s_->event(r, sequence);
  for (int polls = 0;; ++polls) {
    const cudaError_t q = cudaEventQuery(done);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) {
      cudaGetLastError();
      return absl::InternalError(absl::StrCat("waiting for the sender's copy: ",
                                              cudaGetErrorString(q)));
    }
    RETURN_IF_ERROR(abandoned());
    // A chunk's copy takes microseconds: yield first, then sleep briefly.
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

absl::Status CudaIpcBuffer::CopyOut(Ring r, int64_t offset, void* dst,
                                    int64_t bytes, int64_t sequence) {
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(Current(), s_->event(r, sequence), 0),
      "waiting for the sender's copy");
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, s_->ring(r) + offset, static_cast<size_t>(bytes),
                      cudaMemcpyDeviceToDevice, Current()),
      "copy out of the CUDA IPC ring");
  return absl::OkStatus();
}

absl::Status CudaIpcBuffer::MarkCopiedOut(int64_t sequence) {
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaEventRecord(s_->copied_out[sequence % kCudaIpcEvents], Current()),
      "cudaEventRecord (copy out)");
  return absl::OkStatus();
}

absl::Status CudaIpcBuffer::AwaitCopiedOut(int64_t sequence) const {
  GPIPE_CUDA_RETURN_IF_ERROR(
      cudaEventSynchronize(s_->copied_out[sequence % kCudaIpcEvents]),
      "waiting for a copy out of the CUDA IPC ring");
  return absl::OkStatus();
}

}  // namespace gpipe
