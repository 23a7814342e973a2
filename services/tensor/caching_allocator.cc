#include "services/tensor/caching_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "services/core/log.h"

namespace gpipe {
namespace {

class PlainHost final : public RawMemory {
 public:
  void* Get(size_t bytes) override {
    return std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
  }
  void Release(void* p, size_t) override { std::free(p); }
  Device device() const override { return Device::kCpu; }
};

}  // namespace

RawMemory* PlainHostMemory() {
  static PlainHost* host = new PlainHost();
  return host;
}

size_t CachingAllocator::SizeClass(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{1} << 20;
  if (bytes <= kLarge)
    return std::max<size_t>(1, (bytes + kSmall - 1) / kSmall) * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_.empty()) {
    LogWarning("caching allocator destroyed with %zu blocks in use",
               live_.size());
  }
  ReleaseCachedLocked();
}

void* CachingAllocator::Allocate(size_t bytes) {
  const size_t size = SizeClass(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
    ++stats_.hits;
  } else {
    p = upstream_->Get(size);
    if (p == nullptr) {
      // Memory may be sitting in other size classes: return it and retry.
      ReleaseCachedLocked();
      p = upstream_->Get(size);
      if (p == nullptr) throw std::bad_alloc();
    }
    stats_.reserved_bytes += size;
    ++stats_.misses;
  }
  live_[p] = size;
  stats_.in_use_bytes += bytes;
  stats_.peak_in_use_bytes =
      std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return p;
}

void CachingAllocator::Deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    LogError("caching allocator: %p was not allocated here; ignored", ptr);
    return;
  }
  const size_t size = it->second;
  live_.erase(it);
  free_[size].push_back(ptr);
  stats_.cached_bytes += size;
  stats_.in_use_bytes -= bytes;
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

void CachingAllocator::ReleaseCached() {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseCachedLocked();
}

void CachingAllocator::ReleaseCachedLocked() {
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) upstream_->Release(p, size);
    stats_.reserved_bytes -= static_cast<int64_t>(size * blocks.size());
    stats_.cached_bytes -= static_cast<int64_t>(size * blocks.size());
  }
  free_.clear();
}

}  // namespace gpipe
