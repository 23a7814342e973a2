#include "services/data/fashion_mnist.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/data/idx.h"
#include "services/tensor/allocator.h"

namespace gpipe {

FashionMnist::FashionMnist(Shape input_shape, Part train, Part test)
    : input_shape_(std::move(input_shape)),
      train_(std::move(train)),
      test_(std::move(test)) {
  for (int v = 0; v < 256; ++v) {
    scaled_[v] = static_cast<float>(v) / 255.0f;
  }
}

absl::StatusOr<FashionMnist::Part> FashionMnist::ReadPart(
    const std::string& dir, const std::string& prefix) {
  const std::string images_path = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  ASSIGN_OR_RETURN(IdxArray images, ReadIdx(images_path, 3));
  ASSIGN_OR_RETURN(IdxArray labels, ReadIdx(labels_path, 1));
  if (images.dims[1] != 28 || images.dims[2] != 28) {
    return absl::DataLossError(absl::StrCat(images_path, ": images are ",
                                            images.dims[1], "x", images.dims[2],
                                            ", want 28x28"));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::DataLossError(absl::StrCat(labels_path, ": ", labels.dims[0],
                                            " labels for ", images.dims[0],
                                            " images in ", images_path));
  }
  for (uint8_t label : labels.values) {
    if (label >= 10) {
      return absl::DataLossError(
          absl::StrCat(labels_path, ": label ", int{label}, " is not in 0..9"));
    }
  }
  return Part{std::move(images.values), std::move(labels.values)};
}

absl::StatusOr<std::unique_ptr<FashionMnist>> FashionMnist::Open(
    const std::string& dir, const Shape& input_shape) {
  Shape shape = input_shape.rank() == 0 ? Shape{1, 28, 28} : input_shape;
  if (shape.numel() != kPixels) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fashion-MNIST samples have 784 pixels; input shape ",
                     shape.ToString(), " holds ", shape.numel()));
  }
  ASSIGN_OR_RETURN(Part train, ReadPart(dir, "train"));
  ASSIGN_OR_RETURN(Part test, ReadPart(dir, "t10k"));
  return std::unique_ptr<FashionMnist>(
      new FashionMnist(std::move(shape), std::move(train), std::move(test)));
}

int64_t FashionMnist::size(Split split) const {
  return static_cast<int64_t>(part(split).labels.size());
}

Batch FashionMnist::Gather(Split split,
                           const std::vector<int64_t>& indices) const {
  // Batches are host memory whatever allocator the caller has installed;
  // moving them to a device is the caller's business.
  AllocatorScope host(DefaultCpuAllocator());
  const Part& p = part(split);
  const int64_t b = static_cast<int64_t>(indices.size());
  Batch batch{Tensor::Empty(input_shape_.WithBatch(b), DType::kF32),
              Tensor::Empty(Shape{b}, DType::kI32)};
  float* x = batch.inputs.f32();
  int32_t* y = batch.targets.i32();
  for (int64_t i = 0; i < b; ++i) {
    const uint8_t* src = &p.pixels[indices[i] * kPixels];
    for (int64_t k = 0; k < kPixels; ++k) x[i * kPixels + k] = scaled_[src[k]];
    y[i] = p.labels[indices[i]];
  }
  return batch;
}

Tensor FashionMnist::GatherTargets(Split split,
                                   const std::vector<int64_t>& indices) const {
  AllocatorScope host(DefaultCpuAllocator());
  const Part& p = part(split);
  const int64_t b = static_cast<int64_t>(indices.size());
  Tensor targets = Tensor::Empty(Shape{b}, DType::kI32);
  for (int64_t i = 0; i < b; ++i) targets.i32()[i] = p.labels[indices[i]];
  return targets;
}

}  // namespace gpipe
