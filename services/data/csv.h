// A table of numbers (data.csv): one sample per row, every column but the
// target a float32 feature of a [features] input, the target an integer
// class id. Read whole; the dataset never normalizes (data.normalize does,
// with the statistics ComputeStandardization gives).
#ifndef GPIPE_SERVICES_DATA_CSV_H_
#define GPIPE_SERVICES_DATA_CSV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/data/dataset.h"

namespace gpipe {

class CsvDataset final : public Dataset {
 public:
  static constexpr double kDefaultTestFraction = 0.1;

  // Reads `spec.path` (and `spec.test_path`). Cells are trimmed of
  // whitespace; every feature cell must be a finite number and every target
  // an integer >= -1 (-1: nothing to predict). A missing file is NotFound,
  // anything else wrong InvalidArgument, with messages that start with the
  // field of CsvFile and name the line (1-based) and column:
  //   path: /d/t.csv:17: column "age": "abc" is not a number
  static absl::StatusOr<std::unique_ptr<CsvDataset>> Open(
      const gpipe::v1::CsvFile& spec);

  int64_t size(Split split) const override;
  Shape input_shape() const override {
    return Shape{static_cast<int64_t>(feature_names_.size())};
  }
  DType input_dtype() const override { return DType::kF32; }
  Shape target_shape() const override { return Shape{}; }
  // The largest target over both splits plus one, at least 1.
  int64_t num_classes() const override { return num_classes_; }
  Batch Gather(Split split, const std::vector<int64_t>& indices) const override;
  Tensor GatherTargets(Split split,
                       const std::vector<int64_t>& indices) const override;

  // The feature columns in order: their header names, or without a header
  // their zero-based column indices ("0", "2", ...).
  const std::vector<std::string>& feature_names() const {
    return feature_names_;
  }

  struct Standardization {
    std::vector<float> mean, std;
    // As data.normalize holds it (one pair per feature).
    gpipe::v1::Normalize AsNormalize() const {
      gpipe::v1::Normalize n;
      n.mutable_mean()->Assign(mean.begin(), mean.end());
      n.mutable_std()->Assign(std.begin(), std.end());
      return n;
    }
  };
  // Per feature over the train split: the mean and the population standard
  // deviation, summed in double in row order so every process computes the
  // same floats. A constant feature (std 0, or too small to divide by as a
  // float32) gets std 1.
  Standardization ComputeStandardization() const;

 private:
  struct Part {
    int64_t n = 0;
    std::vector<float> features;  // [n, features] row-major
    std::vector<int32_t> targets;
  };

  CsvDataset() = default;
  const Part& part(Split split) const {
    return split == Split::kTrain ? train_ : test_;
  }

  std::vector<std::string> feature_names_;
  Part train_, test_;
  int64_t num_classes_ = 1;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_CSV_H_
