// A pipeline stage's side of the device: its compute stream and copy
// stream, its device activation allocator, and the pinned host buffers that
// boundary activations pass through. Links carry host tensors; a stage on
// the GPU copies what it receives to the device on the copy stream (the
// compute stream waits for it, nothing else does) and copies what it sends
// back through a pinned buffer.
#ifndef GPIPE_SERVICES_TENSOR_DEVICE_TRANSFER_H_
#define GPIPE_SERVICES_TENSOR_DEVICE_TRANSFER_H_

#include <memory>

#include "services/tensor/allocator.h"
#include "services/tensor/tensor.h"

namespace gpipe {

class DeviceTransfer {
 public:
  // Null when no GPU is present (callers then stay on the CPU).
  static std::unique_ptr<DeviceTransfer> Create();
  virtual ~DeviceTransfer() = default;

  // Makes the compute stream current and the stage's device allocator the
  // thread's for the scope's lifetime (one per step on the stage thread).
  class Scope {
   public:
    explicit Scope(DeviceTransfer* t);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    DeviceTransfer* t_;
    std::unique_ptr<AllocatorScope> allocator_;
  };

  // A host tensor's copy on the device, ready for kernels on the compute
  // stream. Device tensors are returned as they are.
  virtual Tensor ToDevice(const Tensor& host) = 0;
  // A device tensor's copy on the host, once the compute stream produced it.
  virtual Tensor ToHost(const Tensor& device) = 0;
  // Device activation memory held by the stage: current and peak.
  virtual CountingAllocator& activations() = 0;

 private:
  virtual void Enter() = 0;
  virtual void Leave() = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_DEVICE_TRANSFER_H_
