// The floating-point mode every compute thread runs in.
#ifndef GPIPE_SERVICES_TENSOR_DENORMALS_H_
#define GPIPE_SERVICES_TENSOR_DENORMALS_H_

namespace gpipe {

// Flush-to-zero and denormals-are-zero on the calling thread: a result or an
// operand below the smallest normal float counts as zero. Arithmetic on
// denormals takes a microcode path about 100x slower on x86; a classifier
// whose loss reaches 0 fills its gradients with them and its steps slowed
// 4x. The process sets it on its first thread before any other exists
// (tensor.cc), and new threads inherit the mode (POSIX), so every thread of
// ours, and the reference trainer as much as the pipeline, computes the
// same bits. A no-op where the CPU has no such mode.
void FlushDenormalsOnThisThread();
// Whether both modes are on for the calling thread.
bool DenormalsFlushedOnThisThread();

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_DENORMALS_H_
