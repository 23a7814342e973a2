// The number of threads our kernels and OpenBLAS use in this process.
#ifndef GPIPE_SERVICES_TENSOR_THREADS_H_
#define GPIPE_SERVICES_TENSOR_THREADS_H_

namespace gpipe {

// Sets both our OpenMP kernels and OpenBLAS to `n` threads (n >= 1), and
// flushes denormals (denormals.h) on the calling thread and its OpenMP team.
void SetComputeThreads(int n);
int ComputeThreads();

// The GEMM kernel OpenBLAS chose for this CPU ("Haswell", "SkylakeX", ...),
// or the one OPENBLAS_CORETYPE named. Results are bitwise reproducible only
// between processes that use the same one (docs/deploy.md).
const char* BlasCoreName();

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_THREADS_H_
