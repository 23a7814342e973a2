// Which devices this process can compute on, and moving bytes between them.
// Without GPIPE_HAVE_CUDA (or without a GPU) only the CPU exists.
#ifndef GPIPE_SERVICES_TENSOR_DEVICE_H_
#define GPIPE_SERVICES_TENSOR_DEVICE_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "services/tensor/allocator.h"
#include "services/tensor/caching_allocator.h"
#include "services/tensor/dtype.h"

namespace gpipe {

// Built with the CUDA backend and a device is visible.
bool CudaAvailable();
// What the GPU is, or why there is none (for logs and --device errors).
std::string CudaDescription();

// "cpu", "cuda" or "auto" (the GPU when one is present). Asking for cuda
// where there is none is FAILED_PRECONDITION; anything else INVALID_ARGUMENT.
absl::StatusOr<Device> ResolveDevice(std::string_view name);

// The process-wide counting allocator of device memory (a caching allocator
// over cudaMalloc); null without CUDA.
CountingAllocator* DefaultCudaAllocator();
// DefaultCpuAllocator() or DefaultCudaAllocator().
Allocator* DefaultAllocator(Device device);
// Device memory through the caching allocator's upstream (cudaMalloc).
RawMemory* CudaDeviceMemory();

// Copies `bytes` between any two devices; ordered on the thread's current
// stream, and the destination is ready to read when it returns.
void CopyBytes(void* dst, Device dst_device, const void* src, Device src_device,
               size_t bytes);
void ZeroBytes(void* dst, Device device, size_t bytes);
// Waits until the thread's current stream is idle (timing; no-op on CPU).
void SynchronizeCuda();

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_DEVICE_H_
