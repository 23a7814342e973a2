// How many samples a convolution's im2col handles at once on the GPU, where
// fewer, larger GEMMs are faster: the column buffer stays near a budget of
// 64 MiB. (The CPU works sample by sample: conv_ops.cc.)
#ifndef GPIPE_SERVICES_TENSOR_CONV_CHUNK_H_
#define GPIPE_SERVICES_TENSOR_CONV_CHUNK_H_

#include <algorithm>
#include <cstdint>

namespace gpipe {

inline constexpr int64_t kGpuColumnFloats = int64_t{16} << 20;

// Samples per chunk for columns of `column_floats_per_sample` floats each
// (channels x kernel^2 x output positions), out of `batch`.
inline int64_t ConvChunkSamples(int64_t budget_floats,
                                int64_t column_floats_per_sample,
                                int64_t batch) {
  return std::clamp<int64_t>(
      budget_floats / std::max<int64_t>(column_floats_per_sample, 1), 1,
      std::max<int64_t>(batch, 1));
}

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TENSOR_CONV_CHUNK_H_
