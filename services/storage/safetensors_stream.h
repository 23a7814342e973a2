// Safetensors files as byte streams: the encoder produces a file's bytes in
// order without assembling them (a checkpoint uploaded while it is encoded),
// and the decoder builds the tensors as the bytes arrive (a checkpoint
// downloaded straight into the tensors), so neither end ever holds a whole
// file beside the tensors it describes. The bytes are exactly those of
// WriteSafetensors and ReadSafetensors (safetensors.h), which use these.
#ifndef GPIPE_SERVICES_STORAGE_SAFETENSORS_STREAM_H_
#define GPIPE_SERVICES_STORAGE_SAFETENSORS_STREAM_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/storage/safetensors.h"
#include "services/storage/safetensors_header.h"
#include "services/tensor/tensor.h"

namespace gpipe {

class SafetensorsEncoder {
 public:
  // Checks `tensors` (CPU, F32 or I32; names unique, non-empty, valid UTF-8,
  // not "__metadata__") and `metadata` as WriteSafetensors does, and lays
  // the file out: tensors sorted by name, data 8-byte aligned. The tensors
  // are not copied: they must outlive the encoder.
  static absl::StatusOr<SafetensorsEncoder> Create(
      const std::vector<std::pair<std::string, const Tensor*>>& tensors,
      const std::map<std::string, std::string>& metadata = {});

  // The length of the whole file.
  uint64_t size() const { return size_; }

  // Calls `append` with the file's bytes in order (the header, then each
  // tensor's bytes in pieces of at most `max_piece` bytes); stops at the
  // first error it returns.
  absl::Status Encode(absl::FunctionRef<absl::Status(std::string_view)> append,
                      size_t max_piece = size_t{1} << 20) const;

 private:
  SafetensorsEncoder() = default;
  std::string header_;               // the length prefix and the JSON
  std::vector<const Tensor*> data_;  // in file order
  uint64_t size_ = 0;
};

class SafetensorsDecoder {
 public:
  // A file of `file_size` bytes (known in advance: its manifest entry, a
  // transfer's header); `what` names it in errors.
  SafetensorsDecoder(uint64_t file_size, std::string what);

  // The next bytes of the file. A malformed header, or more bytes than the
  // file has, is DataLoss naming the file; a dtype we do not hold
  // Unimplemented. After an error the decoder refuses everything.
  absl::Status Consume(std::string_view bytes);

  // The tensors, once every byte has arrived (DataLoss if some are missing).
  absl::StatusOr<SafetensorsFile> Finish();

  uint64_t consumed() const { return consumed_; }

 private:
  absl::Status ConsumeFraming(std::string_view& bytes);

  const uint64_t file_size_;
  const std::string what_;
  uint64_t consumed_ = 0;
  absl::Status failed_;
  std::string framing_;       // the prefix and the JSON, until both are here
  uint64_t header_size_ = 0;  // of the JSON, once the prefix is here
  bool have_header_ = false;
  SafetensorsFile file_;
  std::vector<std::pair<Tensor*, uint64_t>> data_;  // in file order, sizes
  size_t current_ = 0;           // the tensor the next data byte belongs to
  uint64_t current_filled_ = 0;  // its bytes already copied
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_STORAGE_SAFETENSORS_STREAM_H_
