// What every kernel file of ours shares: the block size, the current stage's
// stream, grid-stride loops launched on it, and a warp per row with its
// reproducible sum. Included by .cu files only.
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

// Row kernels give each row a warp: launched with kWarp threads per row
// (GPIPE_LAUNCH(kernel, rows * kWarp, ...)), they walk rows with
// GPIPE_FOR_EACH_ROW, lanes striding over the row's columns.
inline constexpr int kWarp = 32;

// The sum of a warp's values, the same bits in every lane and every run: a
// fixed butterfly whose pairs add commutatively.
inline __device__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The largest of a warp's values, in every lane: exact in any order.
inline __device__ float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace gpipe::cuda

#define GPIPE_FOR_EACH_ROW(row, rows)                                      \
  for (int64_t row =                                                       \
           (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / \
           kWarp;                                                          \
       row < (rows);                                                       \
       row += static_cast<int64_t>(blockDim.x) * gridDim.x / kWarp)

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
