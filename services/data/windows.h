// Language-modelling samples cut from one long sequence of token ids: window
// i is ids [i*T, i*T + T) and its targets are the ids one later. Shared by
// the text and the token-file datasets.
#ifndef GPIPE_SERVICES_DATA_WINDOWS_H_
#define GPIPE_SERVICES_DATA_WINDOWS_H_

#include <cstdint>
#include <vector>

#include "services/data/dataset.h"
#include "services/tensor/allocator.h"

namespace gpipe {

// Inputs and targets [B, seq_len] (int32) of the windows `indices`;
// `id(p)` is the id at position p of the sequence.
template <typename IdAt>
Batch GatherWindows(const std::vector<int64_t>& indices, int64_t seq_len,
                    const IdAt& id) {
  AllocatorScope host(DefaultCpuAllocator());
  const int64_t b = static_cast<int64_t>(indices.size());
  Batch batch{Tensor::Empty(Shape{b, seq_len}, DType::kI32),
              Tensor::Empty(Shape{b, seq_len}, DType::kI32)};
  int32_t* x = batch.inputs.i32();
  int32_t* y = batch.targets.i32();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t start = indices[i] * seq_len;
    for (int64_t t = 0; t < seq_len; ++t) {
      x[i * seq_len + t] = static_cast<int32_t>(id(start + t));
      y[i * seq_len + t] = static_cast<int32_t>(id(start + t + 1));
    }
  }
  return batch;
}

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_WINDOWS_H_
