// The resident ceiling of a heap that keeps its freed memory: a large block
// whose fresh pages would take the process past it has the heap hand its
// free memory back first; pages the heap reuses never do.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"
#include "services/core/memory.h"
#include "services/tensor/allocator.h"

namespace gpipe {
namespace {

// An anonymous mapping of `pages` pages, untouched, unmapped at the end.
class Pages {
 public:
  explicit Pages(int64_t pages)
      : bytes_(pages * sysconf(_SC_PAGE_SIZE)),
        p_(static_cast<char*>(::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))) {}
  ~Pages() { ::munmap(p_, bytes_); }
  char* data() { return p_; }
  int64_t bytes() const { return bytes_; }

 private:
  int64_t bytes_;
  char* p_;
};

// Leaves the process without a ceiling, whatever a test set.
class ResidentCeilingTest : public ::testing::Test {
 protected:
  void TearDown() override { SetResidentCeiling(0); }
};

TEST(NonResidentBytes, CountsThePagesNotYetTouched) {
  const int64_t page = sysconf(_SC_PAGE_SIZE);
  Pages block(16);
  EXPECT_EQ(NonResidentBytes(block.data(), block.bytes()), 16 * page);
  std::memset(block.data(), 1, 8 * page);
  EXPECT_EQ(NonResidentBytes(block.data(), block.bytes()), 8 * page);
  // A range that starts inside a page counts that page.
  EXPECT_EQ(NonResidentBytes(block.data() + 8 * page + 1, 100), 100);
  std::memset(block.data(), 1, block.bytes());
  EXPECT_EQ(NonResidentBytes(block.data(), block.bytes()), 0);
  EXPECT_EQ(NonResidentBytes(nullptr, 4096), 0);
}

TEST_F(ResidentCeilingTest, FreshPagesPastTheCeilingHandTheHeapBack) {
  Pages block(kWatchedBlockBytes * 2 / sysconf(_SC_PAGE_SIZE));
  const int64_t before = HeapReleases();
  // No ceiling, or one the block fits under: nothing.
  BeforeFirstTouch(block.data(), block.bytes());
  SetResidentCeiling(ResidentBytes() + 4 * block.bytes());
  BeforeFirstTouch(block.data(), block.bytes());
  EXPECT_EQ(HeapReleases(), before);
  // Its fresh pages would pass the ceiling.
  SetResidentCeiling(ResidentBytes() + block.bytes() / 2);
  BeforeFirstTouch(block.data(), block.bytes());
  EXPECT_EQ(HeapReleases(), before + 1);
  // Reused pages are resident already: the process does not grow.
  std::memset(block.data(), 1, block.bytes());
  SetResidentCeiling(1);
  BeforeFirstTouch(block.data(), block.bytes());
  EXPECT_EQ(HeapReleases(), before + 1);
  // Blocks below the watched size are the reserve's.
  Pages small(4);
  BeforeFirstTouch(small.data(), small.bytes());
  EXPECT_EQ(HeapReleases(), before + 1);
}

TEST_F(ResidentCeilingTest, TheTensorHeapWatchesItsLargeBlocks) {
  CpuAllocator heap;
  const int64_t before = HeapReleases();
  SetResidentCeiling(1);
  // Fresh from the kernel (glibc maps a block this large on its own).
  void* p = heap.Allocate(2 * kWatchedBlockBytes);
  EXPECT_EQ(HeapReleases(), before + 1);
  heap.Deallocate(p, 2 * kWatchedBlockBytes);
  void* q = heap.Allocate(64);
  EXPECT_EQ(HeapReleases(), before + 1);
  heap.Deallocate(q, 64);
}

}  // namespace
}  // namespace gpipe
