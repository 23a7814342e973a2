// Page-locked (pinned, portable) host buffers for device<->host transfers of
// activations: registered once, handed out again and again, so copies on a
// stage's copy stream can overlap with compute and the transports read the
// same bytes. Without a GPU the pool hands out ordinary host memory with the
// same bookkeeping.
#ifndef GPIPE_SERVICES_TENSOR_PINNED_POOL_H_
#define GPIPE_SERVICES_TENSOR_PINNED_POOL_H_

#include <cstddef>

#include "services/tensor/caching_allocator.h"

namespace gpipe {

class PinnedBufferPool {
 public:
  // A buffer on loan; it goes back to the pool when destroyed.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& o) noexcept { *this = std::move(o); }
    Buffer& operator=(Buffer&& o) noexcept;
    ~Buffer() { Return(); }
    void* data() const { return data_; }
    size_t size() const { return size_; }

   private:
    friend class PinnedBufferPool;
    void Return();
    PinnedBufferPool* pool_ = nullptr;
    void* data_ = nullptr;
    size_t size_ = 0;
  };

  // `memory` defaults to PinnedHostMemory().
  explicit PinnedBufferPool(RawMemory* memory = nullptr);

  // At least `bytes` of host memory, page-locked when page_locked().
  Buffer Acquire(size_t bytes);
  bool page_locked() const { return memory_->page_locked(); }
  CachingAllocator::Stats stats() const { return cache_.stats(); }

 private:
  RawMemory* memory_;
  CachingAllocator cache_;
};

// cudaHostAlloc(portable) memory when a GPU is present, else PlainHostMemory().
RawMemory* PinnedHostMemory();

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_PINNED_POOL_H_
