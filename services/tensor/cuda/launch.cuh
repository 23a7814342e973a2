// What every kernel file of ours shares: the block size, the current stage's
// stream, and grid-stride loops launched on it. Included by .cu files only.
#ifndef GPIPE_SERVICES_TENSOR_CUDA_LAUNCH_CUH_
#define GPIPE_SERVICES_TENSOR_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "services/tensor/cuda/runtime.h"

namespace gpipe::cuda {

inline constexpr int kThreads = 256;

inline cudaStream_t Current() {
  return static_cast<cudaStream_t>(CurrentStream());
}

// Blocks for a grid-stride loop over n elements (at least 1, at most 65535).
inline int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b < 1 ? 1 : b) : 65535);
}

}  // namespace gpipe::cuda

#define GPIPE_FOR_EACH(i, n)                                            \
  for (int64_t i =                                                      \
           blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

#define GPIPE_LAUNCH(kernel, n, ...)                              \
  do {                                                            \
    if ((n) > 0) {                                                \
      kernel<<<Blocks(n), kThreads, 0, Current()>>>(__VA_ARGS__); \
      CheckLastError(#kernel);                                    \
    }                                                             \
  } while (0)

#endif  // GPIPE_SERVICES_TENSOR_CUDA_LAUNCH_CUH_
