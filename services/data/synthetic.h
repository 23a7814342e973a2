// Synthetic tasks made in memory from a seed, for tests and quick
// experiments: every sample is a pure function of (seed, split, index), so
// they are generated on demand and a dataset of millions costs nothing.
#ifndef GPIPE_SERVICES_DATA_SYNTHETIC_H_
#define GPIPE_SERVICES_DATA_SYNTHETIC_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/data/dataset.h"

namespace gpipe {

// COPY and REVERSE: `length` random symbols x in [0, vocab_size), the
// separator vocab_size, then y = x or reverse(x). The model reads the first
// 2 * length of these tokens and predicts each next one; only predictions of
// y count, the targets of the first `length` positions are -1.
class SequenceTask final : public Dataset {
 public:
  enum class Kind { kCopy, kReverse };
  // Sizes and counts must be positive (the factory below checks them).
  SequenceTask(Kind kind, int64_t vocab_size, int64_t length,
               int64_t train_samples, int64_t test_samples, uint64_t seed);

  int64_t size(Split split) const override;
  Shape input_shape() const override { return Shape{2 * length_}; }
  DType input_dtype() const override { return DType::kI32; }
  Shape target_shape() const override { return Shape{2 * length_}; }
  int64_t num_classes() const override { return vocab_size_ + 1; }
  Batch Gather(Split split, const std::vector<int64_t>& indices) const override;

  int32_t separator() const { return static_cast<int32_t>(vocab_size_); }
  // The 2 * length + 1 tokens of one sample: x, separator, y.
  std::vector<int32_t> Sequence(Split split, int64_t index) const;

 private:
  Kind kind_;
  int64_t vocab_size_;
  int64_t length_;
  int64_t train_samples_;
  int64_t test_samples_;
  uint64_t seed_;
};

// CLASSES: `classes` cluster centers drawn from N(0, 1) in R^features; a
// sample is a uniform label and its center plus N(0, 0.5^2) noise.
class GaussianClasses final : public Dataset {
 public:
  static constexpr double kNoise = 0.5;
  GaussianClasses(int64_t features, int64_t classes, int64_t train_samples,
                  int64_t test_samples, uint64_t seed);

  int64_t size(Split split) const override;
  Shape input_shape() const override { return Shape{features_}; }
  DType input_dtype() const override { return DType::kF32; }
  Shape target_shape() const override { return Shape(); }
  int64_t num_classes() const override { return classes_; }
  Batch Gather(Split split, const std::vector<int64_t>& indices) const override;
  // A sample's label is its generator's first draw: no features needed.
  Tensor GatherTargets(Split split,
                       const std::vector<int64_t>& indices) const override;

  // Center of class c, features() values.
  const float* center(int64_t c) const { return &centers_[c * features_]; }

  // Splits of at most this many floats are drawn once, on their first
  // Gather, and copied from then on: the Gaussian draws (a log, a cosine
  // and a square root per feature) cost more than a training step's
  // element-wise work (9 ms of a 784 x 256 batch). Larger ones are drawn on
  // every Gather, as before. Either way the same numbers.
  static constexpr int64_t kDrawnOnceFloats = int64_t{32} << 20;  // 128 MiB

 private:
  // Sample i's label and features of `split` into label, x[features_].
  void Draw(Split split, int64_t index, int32_t* label, float* x) const;
  struct Drawn {
    std::once_flag once;
    std::vector<float> features;  // [samples, features]
    std::vector<int32_t> labels;
  };
  const Drawn* DrawnSplit(Split split) const;

  int64_t features_;
  int64_t classes_;
  int64_t train_samples_;
  int64_t test_samples_;
  uint64_t seed_;
  std::vector<float> centers_;  // [classes, features]
  // Filled once each under its once_flag (DrawnSplit), then only read.
  mutable Drawn drawn_[2];
};

// The test split's size: test_samples, or where it is 0 (protobuf cannot
// tell it from a field left out) a tenth of the training samples, at least
// one, as a file source's test fraction defaults to 0.1.
int64_t SyntheticTestSamples(const gpipe::v1::Synthetic& spec);

// Checks `spec` and builds its task; errors name the offending field
// relative to the Synthetic message ("vocab_size: must be positive").
absl::StatusOr<std::unique_ptr<Dataset>> MakeSynthetic(
    const gpipe::v1::Synthetic& spec, uint64_t seed);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_SYNTHETIC_H_
