// A stand-in GPU for machines without one, so that CI runs the device code
// paths (placement, transfers, checkpoints, final writes, the cluster on
// --device cuda) that a CPU-only run never enters. GPIPE_FAKE_DEVICE=1 in
// the environment turns it on, in any build; it then takes the place of a
// real GPU.
//
// Tensors on Device::kCuda live in one reserved host arena that is mapped
// without access, except while one of this backend's kernels or copies runs
// (FakeDeviceAccess). Host code that reads or writes a device pointer
// directly (a memcpy into a parameter, a writer reading a GPU tensor)
// therefore faults here as it would on a GPU, and the fault is reported as
// such before the process dies. Kernels are the CPU kernels, so a job on the
// fake device computes the CPU's bits; copies are memcpy. There are no
// streams: everything is ordered on the calling thread, so stream races are
// outside what the fake can find (compute-sanitizer on a GPU looks for
// those). Another thread's host access is let through while a kernel runs:
// the fake misses some faults, it never invents one.
#ifndef GPIPE_SERVICES_TENSOR_FAKE_DEVICE_H_
#define GPIPE_SERVICES_TENSOR_FAKE_DEVICE_H_

#include "services/tensor/caching_allocator.h"

namespace gpipe {

// GPIPE_FAKE_DEVICE=1 (read once).
bool FakeDeviceEnabled();

// The guarded arena's memory (Device::kCuda); null when not enabled.
RawMemory* FakeDeviceMemory();

// While it lives, device memory is readable and writable from the host:
// held around each fake kernel and copy. Nests and may be held by several
// threads at once; the arena closes when the last one ends.
class FakeDeviceAccess {
 public:
  // Opens the arena when `on_device` and the fake device is enabled.
  explicit FakeDeviceAccess(bool on_device);
  ~FakeDeviceAccess();
  FakeDeviceAccess(const FakeDeviceAccess&) = delete;
  FakeDeviceAccess& operator=(const FakeDeviceAccess&) = delete;

  // True when it opened the arena (the fake device is in use for this op).
  bool active() const { return active_; }

 private:
  bool active_ = false;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_FAKE_DEVICE_H_
