// The CUDA runtime as the tensor library uses it: whether a device is
// present, device and page-locked host memory, copies ordered on the
// thread's compute stream, and the streams themselves. Built only with
// GPIPE_HAVE_CUDA; nothing here includes CUDA headers, so callers compile
// with a plain C++ compiler.
#ifndef GPIPE_SERVICES_TENSOR_CUDA_RUNTIME_H_
#define GPIPE_SERVICES_TENSOR_CUDA_RUNTIME_H_

#include <cstddef>
#include <string>

namespace gpipe::cuda {

// True when the driver reports at least one device (false on machines with
// the toolkit but no GPU, such as CI). Decided once per process.
bool DevicePresent();
// "NVIDIA H200, sm_90, 139 GiB" or why there is none.
std::string DeviceDescription();

// Plain cudaMalloc / cudaFree (never managed memory); null on failure.
void* DeviceMalloc(size_t bytes);
void DeviceFree(void* p);
// Page-locked, portable host memory (cudaHostAlloc); null on failure.
void* PinnedMalloc(size_t bytes);
void PinnedFree(void* p);

// A CUDA stream owned for its lifetime (non-blocking with respect to the
// legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* handle() const { return handle_; }  // a cudaStream_t
  void Synchronize() const;

 private:
  void* handle_ = nullptr;
};

// A CUDA event owned for its lifetime (no timing), to learn without
// waiting whether the work queued on a stream before it has finished.
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  // Marks the work queued on `stream` so far.
  void Record(void* stream);
  // Whether all of that work has finished (true before any Record).
  bool Done() const;
  void Synchronize() const;

 private:
  void* handle_ = nullptr;  // a cudaEvent_t
};

// The stream kernels and copies of this thread are ordered on (the legacy
// default stream unless a StreamScope says otherwise).
void* CurrentStream();
class StreamScope {
 public:
  explicit StreamScope(const Stream& s);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  void* previous_;
};

// Copies on the current stream. Host-to-device returns once the source may
// be reused; device-to-host returns once the destination holds the bytes.
void CopyHostToDevice(void* dst, const void* src, size_t bytes);
void CopyDeviceToHost(void* dst, const void* src, size_t bytes);
void CopyDeviceToDevice(void* dst, const void* src, size_t bytes);
void ZeroDevice(void* dst, size_t bytes);
// Copies queued on `stream` without waiting (pinned host memory makes them
// truly asynchronous); order other streams after them with StreamWaitStream.
void CopyHostToDeviceAsync(void* dst, const void* src, size_t bytes,
                           void* stream);
void CopyDeviceToHostAsync(void* dst, const void* src, size_t bytes,
                           void* stream);
// Makes `waiter` wait for all work queued on `stream` so far.
void StreamWaitStream(void* waiter, void* stream);
void SynchronizeStream(void* stream);

// Aborts with the CUDA error's text when the last launch failed: a kernel
// fault is a bug, not an input error.
void CheckLastError(const char* what);

}  // namespace gpipe::cuda

#endif  // GPIPE_SERVICES_TENSOR_CUDA_RUNTIME_H_
