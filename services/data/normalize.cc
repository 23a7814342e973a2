#include "services/data/normalize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"

namespace gpipe {
namespace {

// (x - mean[g]) / std[g] over a batch whose samples hold
// groups * group_size elements.
void Apply(const std::vector<float>& mean, const std::vector<float>& std,
           Tensor* batch) {
  const int64_t groups = static_cast<int64_t>(mean.size());
  float* x = batch->f32();
  const int64_t n = batch->numel();
  const int64_t sample = n / std::max<int64_t>(batch->dim(0), 1);
  const int64_t group_size = sample / groups;
  // Subtract then divide, each rounded to float: what a user's
  // `(x - mean) / std` in PyTorch computes, so their inputs match ours.
  for (int64_t at = 0; at < n; at += group_size) {
    const int64_t g = (at % sample) / group_size;
    const float m = mean[g];
    const float s = std[g];
    for (int64_t k = at; k < at + group_size; ++k) x[k] = (x[k] - m) / s;
  }
}

class NormalizedDataset final : public Dataset {
 public:
  NormalizedDataset(std::unique_ptr<Dataset> inner, std::vector<float> mean,
                    std::vector<float> std)
      : inner_(std::move(inner)),
        mean_(std::move(mean)),
        std_(std::move(std)) {}

  int64_t size(Split split) const override { return inner_->size(split); }
  Shape input_shape() const override { return inner_->input_shape(); }
  DType input_dtype() const override { return inner_->input_dtype(); }
  Shape target_shape() const override { return inner_->target_shape(); }
  int64_t num_classes() const override { return inner_->num_classes(); }

  Batch Gather(Split split,
               const std::vector<int64_t>& indices) const override {
    Batch batch = inner_->Gather(split, indices);
    Apply(mean_, std_, &batch.inputs);
    return batch;
  }
  Tensor GatherTargets(Split split,
                       const std::vector<int64_t>& indices) const override {
    return inner_->GatherTargets(split, indices);
  }

 private:
  std::unique_ptr<Dataset> inner_;
  std::vector<float> mean_;
  std::vector<float> std_;
};

// The compute threads flush subnormal floats to zero, so a subnormal std
// divides by 0; it is told by its bits, which that mode leaves alone.
bool IsSubnormal(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return (bits & 0x7f800000u) == 0 && (bits & 0x007fffffu) != 0;
}

// Its value for a message, from the bits: converting it to double would
// read it as 0 on such a thread.
double SubnormalValue(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const double magnitude =
      static_cast<double>(bits & 0x007fffffu) * std::ldexp(1.0, -149);
  return (bits & 0x80000000u) ? -magnitude : magnitude;
}

}  // namespace

absl::Status CheckNormalize(const gpipe::v1::Normalize& normalize,
                            const Shape& input, DType dtype) {
  const int64_t groups = normalize.mean_size();
  if (groups == 0) return absl::InvalidArgumentError("mean: required");
  if (normalize.std_size() != groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("std: has ", normalize.std_size(), " values, mean has ",
                     groups, " (one pair per group)"));
  }
  if (dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("applies to FLOAT32 inputs; the data gives ",
                     AsAbsl(DTypeName(dtype))));
  }
  const int64_t numel = input.numel();
  const int64_t first = input.rank() > 0 ? input[0] : 1;
  if (groups != 1 && groups != first && groups != numel) {
    return absl::InvalidArgumentError(
        absl::StrCat("mean: has ", groups, " values; an input of ",
                     input.ToString(), " takes 1 (the whole sample), ", first,
                     " (its first dimension) or ", numel, " (each element)"));
  }
  for (int64_t g = 0; g < groups; ++g) {
    if (!std::isfinite(normalize.mean(g))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mean[", g, "]: must be finite, got ", normalize.mean(g)));
    }
    if (const float s = normalize.std(g); IsSubnormal(s)) {
      return absl::InvalidArgumentError(
          absl::StrCat("std[", g, "]: ", SubnormalValue(s),
                       " is below the smallest normal float (", FLT_MIN,
                       "), and the compute threads read such a value as 0"));
    }
    if (!(normalize.std(g) > 0) || !std::isfinite(normalize.std(g))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "std[", g, "]: must be positive and finite, got ", normalize.std(g)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dataset>> Normalized(
    std::unique_ptr<Dataset> data, const gpipe::v1::Normalize& normalize) {
  RETURN_IF_ERROR(
      CheckNormalize(normalize, data->input_shape(), data->input_dtype()));
  return std::unique_ptr<Dataset>(new NormalizedDataset(
      std::move(data),
      std::vector<float>(normalize.mean().begin(), normalize.mean().end()),
      std::vector<float>(normalize.std().begin(), normalize.std().end())));
}

absl::Status NormalizeInPlace(const gpipe::v1::Normalize& normalize,
                              Tensor* batch) {
  RETURN_IF_ERROR(CheckNormalize(
      normalize,
      batch->shape().rank() > 0 ? batch->shape().WithoutBatch() : Shape(),
      batch->dtype()));
  Apply(std::vector<float>(normalize.mean().begin(), normalize.mean().end()),
        std::vector<float>(normalize.std().begin(), normalize.std().end()),
        batch);
  return absl::OkStatus();
}

}  // namespace gpipe
