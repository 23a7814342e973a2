#include "services/tensor/allocator.h"

#include <cstdlib>
#include <new>

#include "absl/strings/str_cat.h"
#include "services/core/bytes.h"
#include "services/core/memory.h"
#include "services/tensor/device.h"

namespace gpipe {
namespace {
thread_local Allocator* current_allocator = nullptr;
thread_local Allocator* current_cuda_allocator = nullptr;
thread_local int64_t thread_limit = 0;
thread_local const std::atomic<bool>* thread_cancelled = nullptr;

Allocator*& Slot(Device d) {
  return d == Device::kCpu ? current_allocator : current_cuda_allocator;
}
}  // namespace

void* CpuAllocator::Allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw std::bad_alloc();
  if (rounded >= static_cast<size_t>(kWatchedBlockBytes))
    BeforeFirstTouch(p, static_cast<int64_t>(rounded));
  return p;
}

void CpuAllocator::Deallocate(void* ptr, size_t) { std::free(ptr); }

TensorMemoryExhausted::TensorMemoryExhausted(int64_t requested, int64_t in_use,
                                             int64_t limit)
    : requested_(requested),
      message_(absl::StrCat("a tensor of ", FormatBytes(requested), " with ",
                            FormatBytes(in_use),
                            " of tensors in use would exceed this worker's "
                            "memory for stages, ",
                            FormatBytes(limit))) {}

TensorMemoryLimit::TensorMemoryLimit(int64_t limit_bytes)
    : previous_(thread_limit) {
  thread_limit = limit_bytes;
}

TensorMemoryLimit::~TensorMemoryLimit() { thread_limit = previous_; }

AllocationsCancelledBy::AllocationsCancelledBy(
    const std::atomic<bool>* cancelled)
    : previous_(thread_cancelled) {
  thread_cancelled = cancelled;
}

AllocationsCancelledBy::~AllocationsCancelledBy() {
  thread_cancelled = previous_;
}

void ThrowIfAllocationCancelled() {
  if (thread_cancelled != nullptr &&
      thread_cancelled->load(std::memory_order_relaxed)) {
    throw AllocationCancelled();
  }
}

void* CountingAllocator::Allocate(size_t bytes) {
  if (enforce_thread_limits_ && thread_limit > 0) {
    const int64_t in_use = current_.load();
    if (in_use + static_cast<int64_t>(bytes) > thread_limit) {
      throw TensorMemoryExhausted(static_cast<int64_t>(bytes), in_use,
                                  thread_limit);
    }
  }
  void* p = upstream_->Allocate(bytes);
  Charge(static_cast<int64_t>(bytes));
  return p;
}

void CountingAllocator::Deallocate(void* ptr, size_t bytes) {
  upstream_->Deallocate(ptr, bytes);
  Charge(-static_cast<int64_t>(bytes));
}

void CountingAllocator::Charge(int64_t bytes) {
  const int64_t now = current_.fetch_add(bytes) + bytes;
  if (bytes <= 0) return;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

CountingAllocator* DefaultCpuAllocator() {
  static CpuAllocator* cpu = new CpuAllocator();
  static CountingAllocator* counting = [] {
    auto* c = new CountingAllocator(cpu);
    c->EnforceThreadLimits();
    return c;
  }();
  return counting;
}

Allocator* CurrentAllocator() {
  return current_allocator != nullptr ? current_allocator
                                      : DefaultCpuAllocator();
}

Allocator* CurrentAllocator(Device device) {
  if (device == Device::kCpu) return CurrentAllocator();
  return current_cuda_allocator != nullptr ? current_cuda_allocator
                                           : DefaultCudaAllocator();
}

AllocatorScope::AllocatorScope(Allocator* a)
    : device_(a->device()), previous_(Slot(device_)) {
  Slot(device_) = a;
}

AllocatorScope::~AllocatorScope() { Slot(device_) = previous_; }

}  // namespace gpipe
