// One named tensor of a safetensors file, in any of the format's integer,
// bool or float dtypes (the 8-bit floats aside). The checkpoint reader in
// services/storage holds only what the model computes in (F32, I32); data
// sets come in whatever dtype their authors saved.
#ifndef GPIPE_SERVICES_DATA_SAFETENSORS_ARRAY_H_
#define GPIPE_SERVICES_DATA_SAFETENSORS_ARRAY_H_

#include <string>

#include "absl/status/statusor.h"
#include "services/data/numeric_array.h"

namespace gpipe {

// Reads the header and the bytes of tensor `name` only, so one tensor of a
// large file costs its own size. A missing file is NotFound; a malformed or
// truncated file, a missing tensor (the message lists the file's tensors)
// or an unsupported dtype is InvalidArgument; every message starts with
// `path`.
absl::StatusOr<NumericArray> ReadSafetensorsArray(const std::string& path,
                                                  const std::string& name);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_SAFETENSORS_ARRAY_H_
