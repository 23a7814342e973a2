// Tensors to and from files in the safetensors format as Hugging Face
// defines it (https://huggingface.co/docs/safetensors), so checkpoints can be
// inspected with standard tools. Only F32 and I32 tensors are held; readers
// treat every byte as untrusted and fail with a Status, never a crash.
#ifndef GPIPE_SERVICES_STORAGE_SAFETENSORS_H_
#define GPIPE_SERVICES_STORAGE_SAFETENSORS_H_

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/storage/safetensors_header.h"
#include "services/tensor/tensor.h"

namespace gpipe {

// Writes `tensors` (CPU, F32 or I32) and string `metadata` to `path`,
// replacing it atomically: on any failure, or a crash, `path` keeps its old
// content. Names must be unique, non-empty, valid UTF-8 and not
// "__metadata__" (InvalidArgument otherwise). The file lists tensors sorted
// by name and starts their data 8-byte aligned.
absl::Status WriteSafetensors(
    const std::string& path,
    const std::vector<std::pair<std::string, const Tensor*>>& tensors,
    const std::map<std::string, std::string>& metadata = {});

// What a safetensors file holds.
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
  // Tensors of another dtype, name to dtype (OtherDTypes::kSkip only).
  std::map<std::string, std::string> other_dtypes;
};

// Reads a whole file. A malformed or truncated file is DataLoss, a valid one
// with a dtype other than F32 or I32 Unimplemented (or, with
// OtherDTypes::kSkip, read without those tensors, which it lists); messages
// name `path` and what is wrong.
absl::StatusOr<SafetensorsFile> ReadSafetensors(
    const std::string& path,
    storage::OtherDTypes other = storage::OtherDTypes::kRefuse);

// For a file that is not safetensors but a format users have weights in:
// " (it is a zip archive: torch.save's or numpy's .npz ...)" naming how to
// make safetensors of it; empty for any other file.
std::string OtherWeightsFormatHint(const std::string& path);

// The same from the file's bytes in memory; `what` names them in errors.
absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string_view bytes,
                                                 std::string_view what);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_STORAGE_SAFETENSORS_H_
