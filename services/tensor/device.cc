#include "services/tensor/device.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "services/core/strings.h"
#include "services/tensor/fake_device.h"
#include "services/tensor/pinned_pool.h"

#if GPIPE_HAVE_CUDA
#include "services/tensor/cuda/runtime.h"
#endif

namespace gpipe {
namespace {

[[maybe_unused]] [[noreturn]] void NoCuda(const char* what) {
  std::fprintf(stderr, "%s: a CUDA tensor without the CUDA backend\n", what);
  std::abort();
}

#if GPIPE_HAVE_CUDA
class DeviceMemory final : public RawMemory {
 public:
  void* Get(size_t bytes) override { return cuda::DeviceMalloc(bytes); }
  void Release(void* p, size_t) override { cuda::DeviceFree(p); }
  Device device() const override { return Device::kCuda; }
};

class PinnedHost final : public RawMemory {
 public:
  void* Get(size_t bytes) override { return cuda::PinnedMalloc(bytes); }
  void Release(void* p, size_t) override { cuda::PinnedFree(p); }
  Device device() const override { return Device::kCpu; }
  bool page_locked() const override { return true; }
};
#endif

}  // namespace

bool CudaAvailable() {
  if (FakeDeviceEnabled()) return true;
#if GPIPE_HAVE_CUDA
  return cuda::DevicePresent();
#else
  return false;
#endif
}

std::string CudaDescription() {
  if (FakeDeviceEnabled()) {
    return "fake GPU (GPIPE_FAKE_DEVICE=1): guarded host memory, CPU kernels";
  }
#if GPIPE_HAVE_CUDA
  return cuda::DeviceDescription();
#else
  return "built without the CUDA backend (GPIPE_CUDA=OFF or no nvcc)";
#endif
}

absl::StatusOr<Device> ResolveDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "auto") return CudaAvailable() ? Device::kCuda : Device::kCpu;
  if (name == "cuda") {
    if (CudaAvailable()) return Device::kCuda;
    return absl::FailedPreconditionError(
        absl::StrCat("--device cuda: ", CudaDescription()));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--device: '", AsAbsl(name), "' is not one of cpu, cuda, auto"));
}

RawMemory* CudaDeviceMemory() {
  if (FakeDeviceEnabled()) return FakeDeviceMemory();
#if GPIPE_HAVE_CUDA
  static DeviceMemory* memory = new DeviceMemory();
  return memory;
#else
  return nullptr;
#endif
}

RawMemory* PinnedHostMemory() {
#if GPIPE_HAVE_CUDA
  if (!FakeDeviceEnabled() && CudaAvailable()) {
    static PinnedHost* pinned = new PinnedHost();
    return pinned;
  }
#endif
  return PlainHostMemory();
}

CountingAllocator* DefaultCudaAllocator() {
  if (!CudaAvailable()) return nullptr;
  static CachingAllocator* cache = new CachingAllocator(CudaDeviceMemory());
  static CountingAllocator* counting = new CountingAllocator(cache);
  return counting;
}

Allocator* DefaultAllocator(Device device) {
  if (device == Device::kCpu) return DefaultCpuAllocator();
  return DefaultCudaAllocator();
}

void CopyBytes(void* dst, Device dst_device, const void* src, Device src_device,
               size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::kCpu && src_device == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  if (FakeDeviceEnabled()) {
    FakeDeviceAccess access(true);
    std::memcpy(dst, src, bytes);
    return;
  }
#if GPIPE_HAVE_CUDA
  if (dst_device == Device::kCuda && src_device == Device::kCuda) {
    cuda::CopyDeviceToDevice(dst, src, bytes);
  } else if (dst_device == Device::kCuda) {
    cuda::CopyHostToDevice(dst, src, bytes);
  } else {
    cuda::CopyDeviceToHost(dst, src, bytes);
  }
#else
  NoCuda("CopyBytes");
#endif
}

void SynchronizeCuda() {
#if GPIPE_HAVE_CUDA
  if (!FakeDeviceEnabled() && CudaAvailable())
    cuda::SynchronizeStream(cuda::CurrentStream());
#endif
}

void ZeroBytes(void* dst, Device device, size_t bytes) {
  if (device == Device::kCpu) {
    std::memset(dst, 0, bytes);
    return;
  }
  if (FakeDeviceEnabled()) {
    FakeDeviceAccess access(true);
    std::memset(dst, 0, bytes);
    return;
  }
#if GPIPE_HAVE_CUDA
  cuda::ZeroDevice(dst, bytes);
#else
  NoCuda("ZeroBytes");
#endif
}

}  // namespace gpipe
