// Samples a caller already holds, as a Dataset: the inputs of `gpipectl
// predict` streamed through a pipeline the way a test split is. Both
// splits are the same samples.
#ifndef GPIPE_SERVICES_DATA_ARRAY_DATASET_H_
#define GPIPE_SERVICES_DATA_ARRAY_DATASET_H_

#include <cstdint>
#include <vector>

#include "services/data/dataset.h"

namespace gpipe {

class ArrayDataset final : public Dataset {
 public:
  // `inputs` [N, sample...] (host, float32 or int32); `targets` [N] or
  // [N, T] int32, or undefined for none (every target -1, ignored by the
  // loss). `classes`: what num_classes() reports.
  ArrayDataset(Tensor inputs, Tensor targets, int64_t classes);

  int64_t size(Split) const override { return inputs_.dim(0); }
  Shape input_shape() const override { return inputs_.shape().WithoutBatch(); }
  DType input_dtype() const override { return inputs_.dtype(); }
  Shape target_shape() const override {
    return targets_.shape().WithoutBatch();
  }
  int64_t num_classes() const override { return classes_; }
  Batch Gather(Split split, const std::vector<int64_t>& indices) const override;

 private:
  Tensor inputs_;
  Tensor targets_;
  int64_t classes_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_ARRAY_DATASET_H_
