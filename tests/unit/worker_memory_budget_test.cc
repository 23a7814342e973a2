// A worker's memory for stages: its limit (the flag, or the system's: the
// machine's memory and the limits of its cgroups) less its own use and a
// reserve, refused when nothing is left.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "services/core/memory.h"
#include "worker/memory_budget.h"

namespace gpipe {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

TEST(MemoryBudget, FlagLessOwnUseAndReserve) {
  auto b = ComputeMemoryBudget("8GiB", 64 * kGiB, 100 * kMiB);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->limit, 8 * kGiB);
  EXPECT_EQ(b->source, "--memory_limit");
  EXPECT_EQ(b->reserve, 64 * kMiB + 8 * kGiB / 32);
  EXPECT_EQ(b->stages, 8 * kGiB - 100 * kMiB - b->reserve);
}

TEST(MemoryBudget, EmptyOrAutoTakesTheSystemsLimit) {
  for (const char* flag : {"", "auto"}) {
    auto b = ComputeMemoryBudget(flag, 4 * kGiB, 10 * kMiB);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->limit, 4 * kGiB);
  }
}

TEST(MemoryBudget, RefusesWhatLeavesNothingAndWhatDoesNotParse) {
  auto small = ComputeMemoryBudget("80MiB", 64 * kGiB, 30 * kMiB);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("leaves nothing for stages"),
            std::string::npos)
      << small.status();
  EXPECT_FALSE(ComputeMemoryBudget("lots", 64 * kGiB, 0).ok());
  EXPECT_FALSE(ComputeMemoryBudget("0", 64 * kGiB, 0).ok());
  EXPECT_FALSE(ComputeMemoryBudget("-1GiB", 64 * kGiB, 0).ok());
}

// `ulimit -v` limits the heap too: a model past it was refused by no
// check and ended in std::bad_alloc.
TEST(SystemMemoryLimit, AnAddressSpaceLimitBoundsIt) {
  rlimit before{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &before), 0);
  const int64_t unlimited = SystemMemoryLimit();
  const int64_t shared_before = SharedMemoryLimit();
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  ASSERT_TRUE(statm >> size >> resident);
  const int64_t page = sysconf(_SC_PAGE_SIZE);
  // 1 GiB of address space left past what the process maps now.
  const int64_t room = int64_t{1} << 30;
  if (unlimited < 2 * room + resident * page) {
    GTEST_SKIP() << "too little memory to tell the limits apart";
  }
  rlimit lower = before;
  lower.rlim_cur = std::min<rlim_t>(before.rlim_max, size * page + room);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lower), 0);
  const int64_t limited = SystemMemoryLimit();
  const int64_t room_now = AddressSpaceRoom();
  const int64_t shared = SharedMemoryLimit();
  ASSERT_EQ(setrlimit(RLIMIT_AS, &before), 0);
  // `gpipectl local` divides only the shared half among its workers: each
  // inherits the address-space limit whole.
  EXPECT_EQ(shared, shared_before);
  // The room, read twice, differs by what the process touched in between.
  EXPECT_NEAR(static_cast<double>(limited), static_cast<double>(room_now),
              double{1 << 20});
  // The room and what is resident already, give or take what the process
  // mapped meanwhile.
  EXPECT_GT(limited, room / 2);
  EXPECT_LE(limited, room + resident * page + (int64_t{64} << 20));
}

// The cgroup file system as a container runtime leaves it: the smallest
// limit on the process's path wins, "max" is none. (The shared half alone:
// under a `ulimit -v` the whole would read the address space's room.)
TEST(SystemMemoryLimit, ReadsTheCgroupHierarchy) {
  std::ifstream in("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  if (path.empty()) GTEST_SKIP() << "no cgroup v2 path for this process";
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() /
      ("gpipe-cgroup-test-" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  const std::filesystem::path own = root.string() + (path == "/" ? "" : path);
  std::filesystem::create_directories(own);
  const auto write = [](const std::filesystem::path& p, const char* text) {
    std::ofstream(p) << text;
  };
  const int64_t physical = SharedMemoryLimit(root.string() + "/none");
  EXPECT_GT(physical, 0);
  write(own / "memory.max", "max\n");
  EXPECT_EQ(SharedMemoryLimit(root.string()), physical);
  write(own / "memory.max", "536870912\n");
  EXPECT_EQ(SharedMemoryLimit(root.string()), 512 * kMiB);
  if (own != root) {
    write(root / "memory.max", "268435456\n");  // a smaller parent wins
    EXPECT_EQ(SharedMemoryLimit(root.string()), 256 * kMiB);
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace gpipe
