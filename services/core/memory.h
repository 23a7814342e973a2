// Process-wide malloc settings for processes that move tensors.
#ifndef GPIPE_SERVICES_CORE_MEMORY_H_
#define GPIPE_SERVICES_CORE_MEMORY_H_

#include <cstdint>
#include <string>

namespace gpipe {

// Keeps freed memory in the heap instead of handing it back to the kernel.
// With glibc's defaults every tensor and gRPC buffer of 128 KiB or more came
// from fresh pages, each a page fault on first touch: tensor streaming ran
// 10-25x slower (bench/stream_bench). The binaries link jemalloc, whose
// freed pages then never decay: it keeps large blocks apart from small
// objects, where glibc's one heap let small objects settle between freed
// evaluation batches and grew to twice a worker's live memory (bench/README,
// "A heap that does not fragment"). Without jemalloc (the tests): glibc with
// no mmap per block below 2 GiB, no trimming and one arena. The price
// either way: the process keeps its peak heap. Call at the top of main,
// before threads start.
void KeepFreedMemory();

// A ceiling on this process's resident memory for a heap that keeps its
// freed memory (KeepFreedMemory): a heap that keeps freed pages also keeps
// what it cannot reuse. jemalloc splits a freed 48 MiB block to serve a
// 12 MiB one and maps afresh for the next 48 MiB: a worker whose tensors
// peaked at 167 MiB (its memory model's figure) held 218 MiB of heap for
// them in one run of two, and went 24 MiB past its --memory_limit.
// With a ceiling, a large block whose pages are not yet resident, and would
// take the process past it, first has the heap hand its free memory back
// (BeforeFirstTouch). 0: none. Set once, at the top of main.
void SetResidentCeiling(int64_t bytes);

// Blocks of this size or more are watched against the ceiling; smaller
// ones are the reserve's to cover.
inline constexpr int64_t kWatchedBlockBytes = int64_t{4} << 20;

// For a block the heap has just handed out (`bytes` at `p`, not yet
// written): when its pages not yet resident would take this process's
// resident memory past the ceiling, hands the heap's free memory back to
// the kernel first (ReleaseFreedMemory; the block itself is in use and
// stays). Pages the heap reuses are resident already, so a heap that keeps
// reusing its blocks in steady state is never purged.
void BeforeFirstTouch(void* p, int64_t bytes);

// How often BeforeFirstTouch handed the heap back, since the process began.
int64_t HeapReleases();

// The bytes of [p, p + bytes) whose pages are not resident (mincore); 0
// when unknown.
int64_t NonResidentBytes(const void* p, int64_t bytes);

// This process's minor page faults so far (getrusage): first touches of
// memory, which a measurement in steady state should not time.
int64_t MinorPageFaults();

// Hands the heap's free memory back to the kernel (jemalloc's purge, or
// malloc_trim): after a
// stage ends or is cancelled, so a worker's resident memory falls back to
// what it holds between assignments.
void ReleaseFreedMemory();

// The memory this process may use: the smallest of the machine's physical
// memory and the limits of the cgroups it runs in (cgroup v2 memory.max up
// the hierarchy, or v1 memory.limit_in_bytes), as a container runtime or
// Kubernetes sets them, and an address-space limit (ulimit -v) less the
// mappings the process holds untouched. `cgroup_root` is where the cgroup
// file system is mounted (a test passes a directory of its own).
int64_t SystemMemoryLimit(const std::string& cgroup_root = "/sys/fs/cgroup");

// SystemMemoryLimit's two halves. Memory that processes share (physical and
// the cgroups'), which workers on one machine divide among themselves...
int64_t SharedMemoryLimit(const std::string& cgroup_root = "/sys/fs/cgroup");
// ...and the address-space limit, which each process has whole (its
// children inherit it): unlimited when there is none. The room is what is
// left of it past this process's untouched mappings.
int64_t AddressSpaceLimit();
int64_t AddressSpaceRoom();

// An allocation that fails throws std::bad_alloc, which nothing catches:
// the process ended with "terminate called ..." and a core dump. After this
// it says that it ran out of memory, with its resident size, and exits
// with status 3; anything else that terminates goes to the handler before
// (libstdc++'s, which names the exception) and aborts. Call at the top of
// main.
void ExplainOutOfMemory();

// This process's resident memory (/proc/self/statm), 0 when unknown.
int64_t ResidentBytes();

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_MEMORY_H_
