// The CUDA IPC plane in a build without the CUDA backend: never offered,
// never accepted.
#include "services/transport/cuda_ipc_buffer.h"

namespace gpipe {
namespace {

absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "this build has no CUDA backend (built without nvcc)");
}

}  // namespace

struct CudaIpcBuffer::State {};

std::string CurrentGpuUuid() { return ""; }

CudaIpcBuffer::CudaIpcBuffer(std::unique_ptr<State> s) : s_(std::move(s)) {}
CudaIpcBuffer::~CudaIpcBuffer() = default;

absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> CudaIpcBuffer::Create(
    int64_t, uint64_t, gpipe::v1::CudaIpcOffer*) {
  return NoCuda();
}

absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> CudaIpcBuffer::Open(
    const gpipe::v1::CudaIpcOffer&, uint64_t) {
  return NoCuda();
}

int64_t CudaIpcBuffer::ring_bytes() const { return 0; }
absl::StatusOr<uint64_t> CudaIpcBuffer::ReadAnswerNonce() const {
  return NoCuda();
}
absl::Status CudaIpcBuffer::CopyIn(Ring, int64_t, const void*, int64_t,
                                   int64_t) {
  return NoCuda();
}
absl::Status CudaIpcBuffer::AwaitSenderCopy(
    Ring, int64_t, const std::function<absl::Status()>&) const {
  return NoCuda();
}
absl::Status CudaIpcBuffer::CopyOut(Ring, int64_t, void*, int64_t, int64_t) {
  return NoCuda();
}
absl::Status CudaIpcBuffer::MarkCopiedOut(int64_t) { return NoCuda(); }
absl::Status CudaIpcBuffer::AwaitCopiedOut(int64_t) const { return NoCuda(); }

}  // namespace gpipe
