// The caching allocator's and the pinned pool's bookkeeping, on host memory
// (no GPU needed): size classes, reuse, peak accounting, giving the cache
// back when upstream runs out, and the device flag's errors.
#include <cstring>
#include <new>
#include <vector>

#include "gtest/gtest.h"
#include "services/tensor/caching_allocator.h"
#include "services/tensor/device.h"
#include "services/tensor/pinned_pool.h"
#include "services/tensor/tensor.h"

namespace gpipe {
namespace {

// Host memory with a hard budget, counting what it hands out: a stand-in for
// a device that can run out.
class BudgetMemory final : public RawMemory {
 public:
  explicit BudgetMemory(size_t budget) : budget_(budget) {}
  void* Get(size_t bytes) override {
    if (used_ + bytes > budget_) return nullptr;
    used_ += bytes;
    ++gets;
    return PlainHostMemory()->Get(bytes);
  }
  void Release(void* p, size_t bytes) override {
    used_ -= bytes;
    ++releases;
    PlainHostMemory()->Release(p, bytes);
  }
  Device device() const override { return Device::kCpu; }
  size_t used() const { return used_; }
  int gets = 0, releases = 0;

 private:
  size_t budget_, used_ = 0;
};

TEST(CachingAllocatorTest, SizeClasses) {
  EXPECT_EQ(CachingAllocator::SizeClass(0), 512u);
  EXPECT_EQ(CachingAllocator::SizeClass(1), 512u);
  EXPECT_EQ(CachingAllocator::SizeClass(512), 512u);
  EXPECT_EQ(CachingAllocator::SizeClass(513), 1024u);
  EXPECT_EQ(CachingAllocator::SizeClass(1 << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::SizeClass((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CachingAllocator::SizeClass(5'000'000), size_t{5} << 20);
}

TEST(CachingAllocatorTest, ReusesFreedBlocksOfTheSameClass) {
  BudgetMemory memory(64 << 20);
  CachingAllocator cache(&memory);
  void* a = cache.Allocate(1000);
  std::memset(a, 1, 1000);
  cache.Deallocate(a, 1000);
  void* b = cache.Allocate(900);  // same 1024-byte class
  EXPECT_EQ(a, b);
  void* c = cache.Allocate(3000);  // another class: upstream
  EXPECT_NE(c, b);
  CachingAllocator::Stats s = cache.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(memory.gets, 2);
  EXPECT_EQ(s.in_use_bytes, 900 + 3000);
  EXPECT_EQ(s.reserved_bytes, 1024 + 3072);
  EXPECT_EQ(s.cached_bytes, 0);
  cache.Deallocate(b, 900);
  cache.Deallocate(c, 3000);
  s = cache.stats();
  EXPECT_EQ(s.in_use_bytes, 0);
  EXPECT_EQ(s.cached_bytes, 1024 + 3072);
  cache.ReleaseCached();
  EXPECT_EQ(cache.stats().reserved_bytes, 0);
  EXPECT_EQ(memory.used(), 0u);
  EXPECT_EQ(memory.releases, 2);
}

TEST(CachingAllocatorTest, PeakCountsRequestedBytes) {
  BudgetMemory memory(64 << 20);
  CachingAllocator cache(&memory);
  void* a = cache.Allocate(10'000);
  void* b = cache.Allocate(20'000);
  cache.Deallocate(a, 10'000);
  EXPECT_EQ(cache.stats().peak_in_use_bytes, 30'000);
  cache.ResetPeak();
  EXPECT_EQ(cache.stats().peak_in_use_bytes, 20'000);
  void* c = cache.Allocate(10'000);  // from the cache: still counted
  EXPECT_EQ(cache.stats().peak_in_use_bytes, 30'000);
  cache.Deallocate(b, 20'000);
  cache.Deallocate(c, 10'000);
}

TEST(CachingAllocatorTest, GivesTheCacheBackWhenUpstreamRunsOut) {
  BudgetMemory memory(3 << 20);
  CachingAllocator cache(&memory);
  void* a = cache.Allocate(1 << 20);
  void* b = cache.Allocate(1 << 20);
  cache.Deallocate(a, 1 << 20);
  cache.Deallocate(b, 1 << 20);
  // 2 MiB cached in the 1 MiB class; a 3 MiB block only fits after the
  // cache went back upstream.
  void* c = cache.Allocate(3 << 20);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(cache.stats().cached_bytes, 0);
  EXPECT_EQ(cache.stats().reserved_bytes, 3 << 20);
  EXPECT_THROW(cache.Allocate(1), std::bad_alloc);
  cache.Deallocate(c, 3 << 20);
}

TEST(CachingAllocatorTest, IgnoresPointersItDidNotHandOut) {
  BudgetMemory memory(1 << 20);
  CachingAllocator cache(&memory);
  int x = 0;
  cache.Deallocate(&x, sizeof(x));
  EXPECT_EQ(cache.stats().cached_bytes, 0);
}

TEST(CachingAllocatorTest, TensorsCountThroughAScope) {
  BudgetMemory memory(64 << 20);
  CachingAllocator cache(&memory);
  CountingAllocator counting(&cache);
  {
    AllocatorScope scope(&counting);
    Tensor a = Tensor::Zeros({100, 10});
    Tensor b = Tensor::Zeros({100, 10});
    EXPECT_EQ(counting.current_bytes(), 8000);
  }
  EXPECT_EQ(counting.current_bytes(), 0);
  EXPECT_EQ(counting.peak_bytes(), 8000);
  EXPECT_EQ(cache.stats().cached_bytes, 2 * 4096);
}

TEST(PinnedPoolTest, BuffersAreRegisteredOnceAndReused) {
  BudgetMemory memory(64 << 20);
  PinnedBufferPool pool(&memory);
  EXPECT_FALSE(pool.page_locked());
  void* first;
  {
    PinnedBufferPool::Buffer a = pool.Acquire(100'000);
    ASSERT_NE(a.data(), nullptr);
    EXPECT_EQ(a.size(), 100'000u);
    std::memset(a.data(), 7, a.size());
    first = a.data();
    PinnedBufferPool::Buffer moved = std::move(a);
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(moved.data(), first);
    EXPECT_EQ(pool.stats().in_use_bytes, 100'000);
  }
  EXPECT_EQ(pool.stats().in_use_bytes, 0);
  for (int i = 0; i < 10; ++i) {
    PinnedBufferPool::Buffer b = pool.Acquire(99'900);  // same class
    EXPECT_EQ(b.data(), first);
  }
  EXPECT_EQ(memory.gets, 1);
  EXPECT_EQ(pool.stats().hits, 10);
}

TEST(PinnedPoolTest, FallsBackToHostMemoryWithoutAGpu) {
  PinnedBufferPool pool;
  EXPECT_EQ(pool.page_locked(), CudaAvailable());
  PinnedBufferPool::Buffer b = pool.Acquire(4096);
  std::memset(b.data(), 1, 4096);
}

TEST(DeviceTest, ResolveNames) {
  EXPECT_EQ(*ResolveDevice("cpu"), Device::kCpu);
  EXPECT_EQ(*ResolveDevice("auto"),
            CudaAvailable() ? Device::kCuda : Device::kCpu);
  absl::StatusOr<Device> bad = ResolveDevice("tpu");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tpu"), absl::string_view::npos);
  if (!CudaAvailable()) {
    EXPECT_EQ(ResolveDevice("cuda").status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(DefaultCudaAllocator(), nullptr);
  }
}

TEST(DeviceTest, CpuTensorToCpuIsTheSameStorage) {
  Tensor a = Tensor::Filled({4}, 2.0f);
  Tensor b = a.To(Device::kCpu);
  EXPECT_EQ(a.raw(), b.raw());
}

}  // namespace
}  // namespace gpipe
