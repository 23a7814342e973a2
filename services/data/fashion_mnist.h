// Fashion-MNIST (Xiao et al. 2017): 28x28 grey images of clothing in 10
// classes, 60000 for training and 10000 for testing, read from the four IDX
// files of the Debian package dataset-fashion-mnist.
#ifndef GPIPE_SERVICES_DATA_FASHION_MNIST_H_
#define GPIPE_SERVICES_DATA_FASHION_MNIST_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/data/dataset.h"

namespace gpipe {

class FashionMnist final : public Dataset {
 public:
  static constexpr char kDefaultDir[] = "/usr/share/datasets/fashion-mnist";
  static constexpr int64_t kPixels = 28 * 28;

  // Reads train-{images,labels} and t10k-{images,labels} (…-idx?-ubyte.gz)
  // from `dir`. Samples come out in `input_shape`, any layout of the 784
  // pixels in row-major order ([1, 28, 28] for a CNN, [784] for an MLP);
  // an empty shape means [1, 28, 28].
  static absl::StatusOr<std::unique_ptr<FashionMnist>> Open(
      const std::string& dir, const Shape& input_shape = Shape());

  int64_t size(Split split) const override;
  Shape input_shape() const override { return input_shape_; }
  DType input_dtype() const override { return DType::kF32; }
  Shape target_shape() const override { return Shape(); }
  int64_t num_classes() const override { return 10; }
  // Inputs are pixel / 255, in [0, 1]; a job that wants them centred says
  // so in data.normalize (the examples use the training pixels' mean 0.2860
  // and standard deviation 0.3530).
  Batch Gather(Split split, const std::vector<int64_t>& indices) const override;
  Tensor GatherTargets(Split split,
                       const std::vector<int64_t>& indices) const override;

 private:
  // Raw bytes stay in memory (55 MB rather than 220 MB of floats); Gather
  // scales through a lookup table.
  struct Part {
    std::vector<uint8_t> pixels;  // [N, 784]
    std::vector<uint8_t> labels;  // [N]
  };
  FashionMnist(Shape input_shape, Part train, Part test);
  static absl::StatusOr<Part> ReadPart(const std::string& dir,
                                       const std::string& prefix);
  const Part& part(Split split) const {
    return split == Split::kTrain ? train_ : test_;
  }

  Shape input_shape_;
  Part train_;
  Part test_;
  std::array<float, 256> scaled_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_FASHION_MNIST_H_
