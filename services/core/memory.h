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
