#include "services/core/memory.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <limits>
#include <new>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace gpipe {

// jemalloc's control interface, present when the binary links jemalloc
// (gpipe-worker and gpipectl: gpipe_link_heap in CMake); null under
// glibc's malloc, in the tests and the benchmarks.
extern "C" int mallctl(const char* name, void* old_value, size_t* old_size,
                       void* new_value, size_t new_size) __attribute__((weak));

namespace {

// Never purge freed pages (-1): a purged page faults again when the next
// step takes it. The default 10 s decay cost 20-38 page faults a step on
// the width-1024 MLP (step_bench).
void NeverDecay() {
  ssize_t never = -1;
  for (const char* name : {"arenas.dirty_decay_ms", "arenas.muzzy_decay_ms"})
    mallctl(name, nullptr, nullptr, &never, sizeof never);
  // The arenas made before the defaults changed (the main thread's).
  unsigned arenas = 0;
  size_t size = sizeof arenas;
  if (mallctl("arenas.narenas", &arenas, &size, nullptr, 0) != 0) return;
  for (unsigned i = 0; i < arenas; ++i) {
    for (const char* decay : {"dirty_decay_ms", "muzzy_decay_ms"}) {
      char name[64];
      std::snprintf(name, sizeof name, "arena.%u.%s", i, decay);
      // Arenas not yet in use refuse it; they take the new defaults.
      mallctl(name, nullptr, nullptr, &never, sizeof never);
    }
  }
}

}  // namespace

// Under glibc: the largest threshold mallopt takes (an int): a language
// model's logits and their gradient are 512 MiB each at 4096 tokens of a
// 32000-token vocabulary, and under a 256 MiB threshold each was mmapped
// afresh every step, 257,000 page faults and 28% of the step (bench/README).
// Trimming is off for the same reason: a step that frees them would hand the
// heap's top back. ReleaseFreedMemory still trims when a stage ends.
void KeepFreedMemory() {
  if (mallctl != nullptr) {
    NeverDecay();
    return;
  }
  ::mallopt(M_MMAP_THRESHOLD, std::numeric_limits<int>::max());
  ::mallopt(M_TRIM_THRESHOLD, -1);
  ::mallopt(M_ARENA_MAX, 1);
}

void ReleaseFreedMemory() {
  if (mallctl != nullptr) {
    // MALLCTL_ARENAS_ALL: every arena's free pages.
    mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);
    return;
  }
  ::malloc_trim(0);
}

int64_t MinorPageFaults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max();

// This process's mapped and resident bytes (/proc/self/statm; 0 when
// unknown), read without allocating: the out-of-memory handler reads them
// when the heap is what ran out.
struct Statm {
  int64_t mapped = 0;
  int64_t resident = 0;
};
Statm ReadStatm() {
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char text[128] = {};
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  long long size = 0, resident = 0;
  if (n <= 0 || std::sscanf(text, "%lld %lld", &size, &resident) != 2) {
    return {};
  }
  const int64_t page = sysconf(_SC_PAGE_SIZE);
  return {size * page, resident * page};
}

// A limit file's value: a number of bytes, or "max" (v2) / a huge number
// (v1's "no limit" is 2^63 rounded down to pages): unlimited.
int64_t ReadLimit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!in || !std::getline(in, text)) return kUnlimited;
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &value) ||
      value <= 0) {
    return kUnlimited;
  }
  return value;
}

// The cgroup paths of this process, per hierarchy: "" for v2's unified one,
// the controller list for v1's.
std::vector<std::pair<std::string, std::string>> OwnCgroups() {
  std::vector<std::pair<std::string, std::string>> out;
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> parts =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() == 3) out.emplace_back(parts[1], parts[2]);
  }
  return out;
}

}  // namespace

int64_t SharedMemoryLimit(const std::string& cgroup_root) {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  int64_t limit = pages > 0 && page > 0 ? int64_t{pages} * page : kUnlimited;
  for (const auto& [controllers, path] : OwnCgroups()) {
    const bool v2 = controllers.empty();
    bool memory = v2;
    for (absl::string_view c : absl::StrSplit(controllers, ','))
      memory = memory || c == "memory";
    if (!memory) continue;
    // Every level of the hierarchy may limit; inside a container the
    // process's own path is often "/" of a namespaced mount.
    const std::string base = v2 ? cgroup_root : cgroup_root + "/memory";
    std::string dir = path;
    for (;;) {
      const std::string d = base + (dir == "/" ? "" : dir);
      limit = std::min(limit, ReadLimit(d + (v2 ? "/memory.max"
                                                : "/memory.limit_in_bytes")));
      if (dir.empty() || dir == "/") break;
      const size_t slash = dir.rfind('/');
      dir =
          slash == 0 || slash == std::string::npos ? "/" : dir.substr(0, slash);
    }
  }
  return limit;
}

int64_t AddressSpaceLimit() {
  rlimit address_space{};
  if (::getrlimit(RLIMIT_AS, &address_space) != 0 ||
      address_space.rlim_cur == RLIM_INFINITY) {
    return kUnlimited;
  }
  return static_cast<int64_t>(std::min<rlim_t>(
      address_space.rlim_cur, static_cast<rlim_t>(kUnlimited)));
}

int64_t AddressSpaceRoom() {
  // An address-space limit (ulimit -v) bounds the heap as well: what is
  // left of it past the mappings the process holds without touching them
  // (code, thread stacks). Unseen, a model it could not hold ended in
  // std::bad_alloc instead of the check's message.
  const int64_t cap = AddressSpaceLimit();
  if (cap == kUnlimited) return kUnlimited;
  const Statm now = ReadStatm();
  if (now.mapped <= 0) return kUnlimited;
  return std::max<int64_t>(0, cap - (now.mapped - now.resident));
}

int64_t SystemMemoryLimit(const std::string& cgroup_root) {
  return std::min(SharedMemoryLimit(cgroup_root), AddressSpaceRoom());
}

namespace {

// The handler before ours (libstdc++'s verbose one), for every other end.
std::terminate_handler DefaultTerminate() {
  static const std::terminate_handler previous = std::get_terminate();
  return previous;
}

[[noreturn]] void OnTerminate() {
  bool out_of_memory = false;
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_array_new_length&) {
      // A size computed wrong, not memory run out.
    } catch (const std::bad_alloc&) {
      out_of_memory = true;
    } catch (...) {
    }
  }
  if (!out_of_memory) {
    if (std::terminate_handler previous = DefaultTerminate();
        previous != nullptr && previous != OnTerminate) {
      previous();
    }
    std::abort();
  }
  char message[320];
  const int n = std::snprintf(
      message, sizeof message,
      "%s: out of memory: an allocation failed with %.2f GiB resident "
      "(physical memory, the cgroup's limit or ulimit -v); give the process "
      "more memory or make the job smaller (batch, micro-batch size, "
      "model)\n",
      program_invocation_short_name,
      static_cast<double>(ReadStatm().resident) / (1 << 30));
  if (n > 0) {
    (void)!::write(2, message, std::min<size_t>(n, sizeof message - 1));
  }
  ::_exit(3);
}

}  // namespace

void ExplainOutOfMemory() {
  DefaultTerminate();  // taken before ours replaces it
  std::set_terminate(OnTerminate);
}

int64_t ResidentBytes() { return ReadStatm().resident; }

namespace {
// Process-wide, as the heap it guards is: set once at start.
std::atomic<int64_t> resident_ceiling{0};
std::atomic<int64_t> heap_releases{0};
}  // namespace

void SetResidentCeiling(int64_t bytes) {
  resident_ceiling.store(std::max<int64_t>(0, bytes));
}

int64_t HeapReleases() { return heap_releases.load(); }

int64_t NonResidentBytes(const void* p, int64_t bytes) {
  if (p == nullptr || bytes <= 0) return 0;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGE_SIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) +
                         static_cast<uintptr_t>(bytes) + page - 1) &
                        ~(page - 1);
  std::vector<unsigned char> resident((end - begin) / page);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, resident.data()) !=
      0) {
    return 0;
  }
  int64_t fresh = 0;
  for (unsigned char r : resident)
    if ((r & 1) == 0) ++fresh;
  return std::min<int64_t>(bytes, fresh * static_cast<int64_t>(page));
}

void BeforeFirstTouch(void* p, int64_t bytes) {
  const int64_t ceiling = resident_ceiling.load(std::memory_order_relaxed);
  if (ceiling <= 0 || bytes < kWatchedBlockBytes) return;
  const int64_t fresh = NonResidentBytes(p, bytes);
  if (fresh == 0) return;
  const int64_t resident = ReadStatm().resident;
  if (resident == 0 || resident + fresh <= ceiling) return;
  ReleaseFreedMemory();
  heap_releases.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace gpipe
