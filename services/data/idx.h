// Reader for IDX files, the format of MNIST and Fashion-MNIST: a big-endian
// header (magic 0x000008RR for unsigned bytes of rank RR, then RR dimensions)
// followed by the bytes themselves. Files may be gzip-compressed or plain.
#ifndef GPIPE_SERVICES_DATA_IDX_H_
#define GPIPE_SERVICES_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpipe {

// An n-dimensional array of unsigned bytes, row-major.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;  // product of dims
};

// Reads an unsigned-byte IDX array of rank `rank` (3 for images [N, H, W],
// 1 for labels [N]). The header must match and the file must hold exactly
// the bytes it announces: anything else is DataLossError naming the file.
// A missing file is NotFoundError.
absl::StatusOr<IdxArray> ReadIdx(const std::string& path, int rank);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_IDX_H_
