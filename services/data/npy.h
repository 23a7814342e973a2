// NumPy's .npy files (format versions 1.0, 2.0 and 3.0), as np.save writes
// them: a magic string, a Python dict literal giving the dtype, the order
// and the shape, then the array's bytes. Little-endian numeric dtypes in C
// order only; everything else is refused with a message that says how to
// save the array so it can be read.
#ifndef GPIPE_SERVICES_DATA_NPY_H_
#define GPIPE_SERVICES_DATA_NPY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "services/data/numeric_array.h"

namespace gpipe {

// What the preamble and the header dict say.
struct NpyHeader {
  ElementType type = ElementType::kF32;
  std::vector<int64_t> shape;
  uint64_t data_offset = 0;  // where the array's bytes start in the file
  uint64_t data_bytes = 0;   // how many the shape and dtype call for
};

// Decodes the header at the start of `bytes`, which hold at least the
// preamble and the header (or the whole file when it is shorter). Every
// error is InvalidArgument, without the file's name.
absl::StatusOr<NpyHeader> ParseNpyHeader(std::string_view bytes);

// Reads a whole .npy file. A missing file is NotFound; a malformed,
// truncated or unsupported one InvalidArgument; every message starts with
// `path`.
absl::StatusOr<NumericArray> ReadNpy(const std::string& path);

// A float32 array of `shape` (C order, `values` holding its elements) as
// the bytes of a version 1.0 .npy file, as np.save writes it.
std::string EncodeNpyF32(const std::vector<int64_t>& shape,
                         const float* values);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_NPY_H_
