// Where tensor memory comes from, and how much of it is in use. Each stage of
// a pipeline installs its own CountingAllocator (AllocatorScope) so that its
// peak activation memory can be reported.
#ifndef GPIPE_SERVICES_TENSOR_ALLOCATOR_H_
#define GPIPE_SERVICES_TENSOR_ALLOCATOR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>

#include "services/tensor/dtype.h"

namespace gpipe {

class CountingAllocator;

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
  // This allocator when it counts what it holds (a stage's activations),
  // else null: a tensor another allocator provided can then be counted here
  // as well (Tensor::CountIn).
  virtual CountingAllocator* counting() { return nullptr; }
};

// 64-byte aligned host memory from the C heap.
class CpuAllocator final : public Allocator {
 public:
  void* Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return Device::kCpu; }
};

// Forwards to another allocator and counts the bytes currently held and the
// peak since the last ResetPeak(). Thread-safe.
class CountingAllocator final : public Allocator {
 public:
  explicit CountingAllocator(Allocator* upstream) : upstream_(upstream) {}
  void* Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return upstream_->device(); }
  CountingAllocator* counting() override { return this; }

  // Counts `bytes` (negative: gives them up) that another allocator
  // provided but this allocator's owner holds: a tensor a link's reader
  // thread built, or one whose storage is a shared-memory ring.
  void Charge(int64_t bytes);

  // Makes Allocate refuse, on threads under a TensorMemoryLimit, what would
  // take this allocator past the thread's limit (the process-wide
  // allocator's setting).
  void EnforceThreadLimits() { enforce_thread_limits_ = true; }

  int64_t current_bytes() const { return current_.load(); }
  int64_t peak_bytes() const { return peak_.load(); }
  // Starts a new peak window at the current level.
  void ResetPeak() { peak_.store(current_.load()); }

 private:
  Allocator* upstream_;
  bool enforce_thread_limits_ = false;
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

// Thrown by an allocation on a thread under a TensorMemoryLimit that would
// take the process's host tensors past the limit. A std::bad_alloc, so code
// that handles running out of memory handles this too.
class TensorMemoryExhausted : public std::bad_alloc {
 public:
  TensorMemoryExhausted(int64_t requested, int64_t in_use, int64_t limit);
  const char* what() const noexcept override { return message_.c_str(); }
  int64_t requested() const { return requested_; }

 private:
  int64_t requested_;
  std::string message_;
};

// While it lives, host tensors allocated on this thread fail with
// TensorMemoryExhausted instead of taking the process's host tensors
// (DefaultCpuAllocator) past `limit_bytes` (0: no limit). Only threads that
// can fail cleanly (a stage's) set one: other threads' tensors (a link's
// reader) still count, and the limited thread meets them at its next
// allocation.
class TensorMemoryLimit {
 public:
  explicit TensorMemoryLimit(int64_t limit_bytes);
  ~TensorMemoryLimit();
  TensorMemoryLimit(const TensorMemoryLimit&) = delete;
  TensorMemoryLimit& operator=(const TensorMemoryLimit&) = delete;

 private:
  int64_t previous_;
};

// Thrown by a tensor allocation on a thread under an AllocationsCancelledBy
// whose flag is set: a cancelled stage stops at its next allocation (every
// layer op allocates its output), within one layer op of the cancel, instead
// of at the end of its micro-batch or step.
class AllocationCancelled : public std::exception {
 public:
  const char* what() const noexcept override {
    return "cancelled while computing";
  }
};

// While it lives, host and device tensor allocations on this thread throw
// AllocationCancelled once `*cancelled` is true. The flag must outlive it.
class AllocationsCancelledBy {
 public:
  explicit AllocationsCancelledBy(const std::atomic<bool>* cancelled);
  ~AllocationsCancelledBy();
  AllocationsCancelledBy(const AllocationsCancelledBy&) = delete;
  AllocationsCancelledBy& operator=(const AllocationsCancelledBy&) = delete;

 private:
  const std::atomic<bool>* previous_;
};

// Throws AllocationCancelled when this thread's cancel flag is set: for
// allocators that do not go through a CountingAllocator.
void ThrowIfAllocationCancelled();

// The process-wide counting allocator for host memory.
CountingAllocator* DefaultCpuAllocator();

// The allocator new host tensors on this thread use (DefaultCpuAllocator()
// unless an AllocatorScope says otherwise).
Allocator* CurrentAllocator();
// The same for tensors on `device` (DefaultCudaAllocator() for kCuda).
Allocator* CurrentAllocator(Device device);

// Makes `a` the allocator of new tensors on its device on this thread for
// its lifetime.
class AllocatorScope {
 public:
  explicit AllocatorScope(Allocator* a);
  ~AllocatorScope();
  AllocatorScope(const AllocatorScope&) = delete;
  AllocatorScope& operator=(const AllocatorScope&) = delete;

 private:
  Device device_;
  Allocator* previous_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_ALLOCATOR_H_
