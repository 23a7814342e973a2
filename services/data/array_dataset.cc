#include "services/data/array_dataset.h"

#include <algorithm>
#include <utility>

namespace gpipe {

ArrayDataset::ArrayDataset(Tensor inputs, Tensor targets, int64_t classes)
    : inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      classes_(classes) {
  if (!targets_.defined()) {
    AllocatorScope host(DefaultCpuAllocator());
    targets_ = Tensor::Empty(Shape{inputs_.dim(0)}, DType::kI32);
    std::fill(targets_.i32(), targets_.i32() + targets_.numel(), -1);
  }
}

Batch ArrayDataset::Gather(Split, const std::vector<int64_t>& indices) const {
  AllocatorScope host(DefaultCpuAllocator());
  const int64_t b = static_cast<int64_t>(indices.size());
  Batch batch{Tensor::Empty(input_shape().WithBatch(b), inputs_.dtype()),
              Tensor::Empty(target_shape().WithBatch(b), DType::kI32)};
  const int64_t in = input_shape().numel(), out = target_shape().numel();
  // Both dtypes are 4 bytes: rows copy as raw words.
  const auto* x = reinterpret_cast<const uint32_t*>(inputs_.f32());
  auto* bx = reinterpret_cast<uint32_t*>(batch.inputs.f32());
  for (int64_t i = 0; i < b; ++i) {
    std::copy_n(x + indices[i] * in, in, bx + i * in);
    std::copy_n(targets_.i32() + indices[i] * out, out,
                batch.targets.i32() + i * out);
  }
  return batch;
}

}  // namespace gpipe
