// data.normalize: an affine map of each FLOAT32 input element by the group it
// belongs to, applied as batches are gathered, so every dataset (and the
// standardization a CSV file computes) goes through one piece of code and
// the model file can record exactly what its inputs were.
#ifndef GPIPE_SERVICES_DATA_NORMALIZE_H_
#define GPIPE_SERVICES_DATA_NORMALIZE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/data/dataset.h"

namespace gpipe {

// Checks `normalize` against one sample of FLOAT32 `input`: mean and std of
// the same length, one value, one per entry of the first dimension or one
// per element; every mean finite, every std positive and finite. Errors
// name the field ("mean", "std") and the offending value; the caller
// prefixes "data.normalize.".
absl::Status CheckNormalize(const gpipe::v1::Normalize& normalize,
                            const Shape& input, DType dtype);

// `data` with its inputs mapped to (x - mean[g]) / std[g] in float32, g the
// element's group. CheckNormalize's errors if the two do not fit.
absl::StatusOr<std::unique_ptr<Dataset>> Normalized(
    std::unique_ptr<Dataset> data, const gpipe::v1::Normalize& normalize);

// The same map on a batch [B, sample...] in place (what a model file's
// user does to their own inputs): CheckNormalize's errors for the sample.
absl::Status NormalizeInPlace(const gpipe::v1::Normalize& normalize,
                              Tensor* batch);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_NORMALIZE_H_
