// The framing of a safetensors file: an 8-byte little-endian header length,
// the JSON header naming each tensor's dtype, shape and byte range, then the
// data buffer. Encodes the header for the writer and validates it for the
// readers, which share every check whether bytes come from memory or disk.
#ifndef GPIPE_SERVICES_STORAGE_SAFETENSORS_HEADER_H_
#define GPIPE_SERVICES_STORAGE_SAFETENSORS_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "services/storage/file_io.h"
#include "services/tensor/dtype.h"

namespace gpipe::storage {

inline constexpr size_t kHeaderLengthBytes = 8;
// A longer header is refused before it is read; Hugging Face's reader uses
// the same limit, so no file it accepts is refused here for its header size.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// One tensor as the header describes it.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // data_offsets: [begin, end) relative to the start of the data buffer.
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // ascending offsets once parsed
  std::map<std::string, std::string> metadata;
  // With OtherDTypes::kSkip: the tensors of a dtype we do not hold (F16,
  // BF16, I64, ...), name to dtype, left out of `entries`.
  std::map<std::string, std::string> other_dtypes;
};

// What parsing does with a valid tensor of a dtype other than F32 and I32:
// refuses the file (Unimplemented), or skips the tensor and lists it
// (init_from: a PyTorch BatchNorm's I64 num_batches_tracked is no weight).
enum class OtherDTypes { kRefuse, kSkip };

// "F32" for kF32, "I32" for kI32.
std::string_view SafetensorsDTypeName(DType dtype);

// Decodes the length prefix, the first kHeaderLengthBytes of a file of
// `file_size` bytes (`prefix` may be shorter when the file is), and checks
// that a header of that length fits. Errors are DataLoss and start with
// `what`, the file's name.
absl::StatusOr<uint64_t> DecodeHeaderLength(std::string_view prefix,
                                            uint64_t file_size,
                                            std::string_view what);

// The header JSON of the open safetensors file `fd` of `file_size` bytes:
// the length prefix read and checked (DecodeHeaderLength), then the JSON
// itself; the data buffer follows it, at kHeaderLengthBytes + its size.
absl::StatusOr<std::string> ReadHeaderJson(const ScopedFd& fd,
                                           const std::string& path,
                                           uint64_t file_size);

// Parses the header JSON and checks it against a data buffer of `data_size`
// bytes: dtypes and shapes well-formed, each tensor's byte range exactly its
// size, and the ranges tiling the buffer without gaps or overlap. Errors are
// DataLoss, except Unimplemented for a valid safetensors dtype we do not
// hold (e.g. BF16); every message starts with `what`.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    std::string_view json, uint64_t data_size, std::string_view what,
    OtherDTypes other = OtherDTypes::kRefuse);

// The length prefix and JSON for `header`, whose entries' offsets the caller
// has set, padded with spaces so the data buffer starts 8-byte aligned.
// Names and metadata must be valid UTF-8.
std::string EncodeSafetensorsHeader(const SafetensorsHeader& header);

// `s` quoted and escaped as JSON (bytes that are not UTF-8 as \xNN), and
// cut short when long, for error messages about names read from untrusted
// files.
std::string QuoteForMessage(std::string_view s);

}  // namespace gpipe::storage

#endif  // GPIPE_SERVICES_STORAGE_SAFETENSORS_HEADER_H_
