#include "services/tensor/pinned_pool.h"

#include <utility>

namespace gpipe {

PinnedBufferPool::Buffer& PinnedBufferPool::Buffer::operator=(
    Buffer&& o) noexcept {
  if (this != &o) {
    Return();
    pool_ = std::exchange(o.pool_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void PinnedBufferPool::Buffer::Return() {
  if (pool_ != nullptr) pool_->cache_.Deallocate(data_, size_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

PinnedBufferPool::PinnedBufferPool(RawMemory* memory)
    : memory_(memory != nullptr ? memory : PinnedHostMemory()),
      cache_(memory_) {}

PinnedBufferPool::Buffer PinnedBufferPool::Acquire(size_t bytes) {
  Buffer b;
  b.data_ = cache_.Allocate(bytes);
  b.size_ = bytes;
  b.pool_ = this;
  return b;
}

}  // namespace gpipe
