#include "services/tensor/allocator.h"

#include <cstdlib>
#include <new>

#include "services/tensor/device.h"

namespace gpipe {
namespace {
thread_local Allocator* current_allocator = nullptr;
thread_local Allocator* current_cuda_allocator = nullptr;

Allocator*& Slot(Device d) {
  return d == Device::kCpu ? current_allocator : current_cuda_allocator;
}
}  // namespace

void* CpuAllocator::Allocate(size_t bytes) {
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void CpuAllocator::Deallocate(void* ptr, size_t) { std::free(ptr); }

void* CountingAllocator::Allocate(size_t bytes) {
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
  static CountingAllocator* counting = new CountingAllocator(cpu);
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
