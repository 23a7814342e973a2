#include "services/tensor/cuda/runtime.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace gpipe::cuda {
namespace {

thread_local cudaStream_t current_stream = nullptr;

void Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
  std::abort();
}

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

bool DevicePresent() {
  static const bool present = [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: no driver is not a sticky error
      return false;
    }
    return n > 0;
  }();
  return present;
}

std::string DeviceDescription() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("no CUDA device (", cudaGetErrorString(e), ")");
  }
  if (n == 0) return "no CUDA device";
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return "CUDA device 0";
  return absl::StrCat(p.name, ", sm_", p.major, p.minor, ", ",
                      p.totalGlobalMem >> 30, " GiB, ", p.multiProcessorCount,
                      " SMs");
}

void* DeviceMalloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void DeviceFree(void* p) {
  if (p != nullptr) Check(cudaFree(p), "cudaFree");
}

void* PinnedMalloc(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocPortable) !=
      cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void PinnedFree(void* p) {
  if (p != nullptr) Check(cudaFreeHost(p), "cudaFreeHost");
}

Stream::Stream() {
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
        "cudaStreamCreate");
  handle_ = s;
}

Stream::~Stream() {
  if (handle_ != nullptr) cudaStreamDestroy(AsStream(handle_));
}

void Stream::Synchronize() const { SynchronizeStream(handle_); }

Event::Event() {
  cudaEvent_t e = nullptr;
  Check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
        "cudaEventCreate");
  handle_ = e;
}

Event::~Event() {
  if (handle_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

void Event::Record(void* stream) {
  Check(cudaEventRecord(static_cast<cudaEvent_t>(handle_), AsStream(stream)),
        "cudaEventRecord");
}

bool Event::Done() const {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (e == cudaErrorNotReady) return false;
  Check(e, "cudaEventQuery");
  return true;
}

void Event::Synchronize() const {
  Check(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)),
        "cudaEventSynchronize");
}

void* CurrentStream() { return current_stream; }

StreamScope::StreamScope(const Stream& s) : previous_(current_stream) {
  current_stream = AsStream(s.handle());
}

StreamScope::~StreamScope() { current_stream = AsStream(previous_); }

void CopyHostToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Check(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, current_stream),
      "copy host to device");
}

void CopyDeviceToHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Check(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, current_stream),
      "copy device to host");
  Check(cudaStreamSynchronize(current_stream), "copy device to host");
}

void CopyDeviceToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                        current_stream),
        "copy device to device");
}

void ZeroDevice(void* dst, size_t bytes) {
  if (bytes == 0) return;
  Check(cudaMemsetAsync(dst, 0, bytes, current_stream), "cudaMemsetAsync");
}

void CopyHostToDeviceAsync(void* dst, const void* src, size_t bytes,
                           void* stream) {
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                        AsStream(stream)),
        "async copy host to device");
}

void CopyDeviceToHostAsync(void* dst, const void* src, size_t bytes,
                           void* stream) {
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
                        AsStream(stream)),
        "async copy device to host");
}

void StreamWaitStream(void* waiter, void* stream) {
  if (waiter == stream) return;
  // One event per thread, recorded again for every wait: a wait captures
  // the record it follows when it is queued, so re-recording cannot change
  // an earlier wait (creating an event per call cost a driver call more).
  struct Event {
    cudaEvent_t e = nullptr;
    ~Event() {
      if (e != nullptr) cudaEventDestroy(e);
    }
  };
  thread_local Event event;
  if (event.e == nullptr) {
    Check(cudaEventCreateWithFlags(&event.e, cudaEventDisableTiming),
          "cudaEventCreate");
  }
  Check(cudaEventRecord(event.e, AsStream(stream)), "cudaEventRecord");
  Check(cudaStreamWaitEvent(AsStream(waiter), event.e, 0),
        "cudaStreamWaitEvent");
}

void SynchronizeStream(void* stream) {
  Check(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
}

void CheckLastError(const char* what) { Check(cudaGetLastError(), what); }

}  // namespace gpipe::cuda
