// Process-wide malloc settings for processes that move tensors.
#ifndef GPIPE_SERVICES_CORE_MEMORY_H_
#define GPIPE_SERVICES_CORE_MEMORY_H_

namespace gpipe {

// Keeps freed memory in the heap instead of handing it back to the kernel:
// no mmap per large block, no trimming, one arena (another arena cannot hold
// a 64 MiB block and would mmap it). With glibc's defaults every tensor and
// gRPC buffer of 128 KiB or more comes from fresh pages, each a page fault
// on first touch: tensor streaming ran 10-25x slower (bench/stream_bench).
// The price: the process keeps its peak heap instead of shrinking. Call at
// the top of main, before threads start.
void KeepFreedMemory();

// Hands the heap's free memory back to the kernel (malloc_trim): after a
// stage ends or is cancelled, so a worker's resident memory falls back to
// what it holds between assignments.
void ReleaseFreedMemory();

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_MEMORY_H_
