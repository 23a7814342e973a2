// A data set saved as arrays (data.tensors): inputs [N, sample...] and
// integer class ids [N] or [N, T] from .npy files or tensors of a
// .safetensors file, as NumPy or PyTorch users already have them. Read
// whole and converted once to what the model takes.
#ifndef GPIPE_SERVICES_DATA_TENSOR_FILES_H_
#define GPIPE_SERVICES_DATA_TENSOR_FILES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/data/dataset.h"

namespace gpipe {

class TensorFilesDataset final : public Dataset {
 public:
  static constexpr double kDefaultTestFraction = 0.1;

  // Reads the files `spec` names. Each sample's elements are laid out in
  // `model_input` (its numel must match; rank 0: the files' sample shape)
  // and converted to `model_dtype`: kF32 (any numeric array, every value
  // finite) or kI32 (integer ids, each >= 0 and within int32). Targets are
  // integer ids >= -1 (-1: nothing to predict). A missing file is NotFound,
  // anything wrong with a file or the spec InvalidArgument; messages start
  // with the field of TensorFiles, then the path:
  //   "targets: /d/y.npy: id -3 at sample 17 (ids are >= 0, or -1 for none)"
  static absl::StatusOr<std::unique_ptr<TensorFilesDataset>> Open(
      const gpipe::v1::TensorFiles& spec, const Shape& model_input,
      DType model_dtype);

  int64_t size(Split split) const override;
  Shape input_shape() const override { return input_shape_; }
  DType input_dtype() const override { return input_dtype_; }
  Shape target_shape() const override { return target_shape_; }
  // The largest target id over both splits plus one, at least 1.
  int64_t num_classes() const override { return num_classes_; }
  Batch Gather(Split split, const std::vector<int64_t>& indices) const override;
  Tensor GatherTargets(Split split,
                       const std::vector<int64_t>& indices) const override;

  // For int32 inputs, the largest input id over both splits plus one: what
  // an embedding's table must hold (it may exceed num_classes(), e.g. when
  // sequences of many tokens are labelled with few classes). 0 for float
  // inputs.
  int64_t num_input_ids() const override { return num_input_ids_; }

 private:
  // One split's samples, converted: f32 or i32 as the model takes them.
  struct Part {
    int64_t n = 0;
    std::vector<float> f32;
    std::vector<int32_t> i32;
    std::vector<int32_t> targets;
  };

  TensorFilesDataset() = default;
  // Moves the last `n` samples of train_ into test_.
  void SplitOffTest(int64_t n);
  const Part& part(Split split) const {
    return split == Split::kTrain ? train_ : test_;
  }

  Part train_, test_;
  Shape input_shape_;
  DType input_dtype_ = DType::kF32;
  Shape target_shape_;
  int64_t num_classes_ = 1;
  int64_t num_input_ids_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_TENSOR_FILES_H_
