// A dataset of numbered samples with a train and a test split, read whole
// into memory. Batches are gathered by index, so any sampler can drive it.
#ifndef GPIPE_SERVICES_DATA_DATASET_H_
#define GPIPE_SERVICES_DATA_DATASET_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/tensor/tensor.h"

namespace gpipe {

enum class Split { kTrain, kTest };

// Inputs [B, sample shape...] (float32 or int32 ids) and integer targets:
// [B] for classification or [B, T] per token, -1 where nothing is predicted.
struct Batch {
  Tensor inputs;
  Tensor targets;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size(Split split) const = 0;
  // The shape and dtype of one input sample, and of one target.
  virtual Shape input_shape() const = 0;
  virtual DType input_dtype() const = 0;
  virtual Shape target_shape() const = 0;  // [] or [T]
  // Number of classes the targets range over (vocabulary for token tasks).
  virtual int64_t num_classes() const = 0;
  // For int32 inputs, how many token ids they range over (what the first
  // layer's embedding must hold): the vocabulary, as the targets', unless a
  // dataset knows better. 0 for float inputs.
  virtual int64_t num_input_ids() const {
    return input_dtype() == DType::kI32 ? num_classes() : 0;
  }
  // Gathers the samples `indices` (each < size(split)) into one batch.
  virtual Batch Gather(Split split,
                       const std::vector<int64_t>& indices) const = 0;
  // Only the targets of those samples, as Gather returns them: the last
  // stage's input comes down the pipe. Datasets whose inputs cost more to
  // gather than their targets override it.
  virtual Tensor GatherTargets(Split split,
                               const std::vector<int64_t>& indices) const {
    return Gather(split, indices).targets;
  }
};

// Opens the dataset a job's DataSpec describes (reads files, makes synthetic
// data); errors name the field and the file, as in
// "data.text.path: cannot open /x/y: No such file or directory".
// `model_input` is the shape of one sample the model takes; image datasets
// lay their pixels out in it ([1, 28, 28] or [784]), an empty shape means
// their natural layout, and other datasets ignore it. `seed` drives the
// synthetic tasks; `model_dtype` is what tensor files are converted to.
// data.normalize (or a CSV file's standardization) is applied to the inputs.
// Gather returns host (CPU) tensors.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(
    const gpipe::v1::DataSpec& spec, const Shape& model_input, uint64_t seed,
    DType model_dtype = DType::kF32);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_DATASET_H_
