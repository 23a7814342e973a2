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
};

// Reads a whole file. A malformed or truncated file is DataLoss, a valid one
// with a dtype other than F32 or I32 Unimplemented; messages name `path`
// and what is wrong.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// The same from the file's bytes in memory; `what` names them in errors.
absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string_view bytes,
                                                 std::string_view what);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_STORAGE_SAFETENSORS_H_
