// The number of threads our kernels use in this process.
#ifndef GPIPE_SERVICES_TENSOR_THREADS_H_
#define GPIPE_SERVICES_TENSOR_THREADS_H_

namespace gpipe {

// Sets our OpenMP kernels to `n` threads (n >= 1), and
// flushes denormals (denormals.h) on the calling thread and its OpenMP team.
void SetComputeThreads(int n);
int ComputeThreads();

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_THREADS_H_
