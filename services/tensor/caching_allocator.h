// A caching allocator for memory that is slow to get and to give back
// (cudaMalloc synchronizes the device; cudaHostAlloc pins pages). Freed
// blocks stay in a free list of their size class and are handed out again;
// the upstream is asked only on a miss, and the cache is returned upstream
// when an upstream request fails or on ReleaseCached().
//
// Blocks are reused in the order their users freed them, which is safe when
// all work on the memory is ordered on one stream: give each stage's compute
// stream its own CachingAllocator.
#ifndef GPIPE_SERVICES_TENSOR_CACHING_ALLOCATOR_H_
#define GPIPE_SERVICES_TENSOR_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "services/tensor/allocator.h"

namespace gpipe {

// Where the blocks come from: device memory, page-locked host memory, or
// plain host memory (the fallback without a GPU, and what tests use).
class RawMemory {
 public:
  virtual ~RawMemory() = default;
  virtual void* Get(size_t bytes) = 0;  // null when none is left
  virtual void Release(void* p, size_t bytes) = 0;
  virtual Device device() const = 0;
  // True when host blocks are page-locked (device copies can overlap).
  virtual bool page_locked() const { return false; }
};

// 64-byte aligned memory from the C heap.
RawMemory* PlainHostMemory();

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(RawMemory* upstream) : upstream_(upstream) {}
  // Returns the cache upstream; blocks still in use are reported and leaked
  // (a tensor that outlives its allocator is a bug elsewhere).
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Throws std::bad_alloc when upstream has nothing left even after the
  // cache was returned to it (as operator new does).
  void* Allocate(size_t bytes) override;
  void Deallocate(void* ptr, size_t bytes) override;
  Device device() const override { return upstream_->device(); }

  // The size a request is served with: multiples of 512 bytes up to 1 MiB,
  // of 1 MiB above (so activations of one shape always share a class).
  static size_t SizeClass(size_t bytes);

  struct Stats {
    int64_t in_use_bytes = 0;       // requested bytes held by callers
    int64_t peak_in_use_bytes = 0;  // since the last ResetPeak()
    int64_t cached_bytes = 0;       // free blocks kept for reuse
    int64_t reserved_bytes = 0;     // everything taken from upstream
    int64_t hits = 0;               // requests served from the cache
    int64_t misses = 0;             // requests that went upstream
  };
  Stats stats() const;
  void ResetPeak();
  // Gives every cached block back upstream.
  void ReleaseCached();

 private:
  void ReleaseCachedLocked();

  RawMemory* upstream_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> blocks
  std::unordered_map<void*, size_t> live_;     // block -> size class
  Stats stats_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_CACHING_ALLOCATOR_H_
