#include "services/storage/safetensors.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/storage/file_io.h"
#include "services/storage/json_header.h"
#include "services/storage/safetensors_header.h"
#include "services/storage/safetensors_stream.h"
#include "services/tensor/allocator.h"

namespace gpipe {
namespace {

using storage::SafetensorsEntry;
using storage::SafetensorsHeader;

// Turns a validated header into tensors; `fill` copies one entry's bytes.
absl::StatusOr<SafetensorsFile> Materialize(
    SafetensorsHeader header,
    absl::FunctionRef<absl::Status(const SafetensorsEntry&, void*)> fill) {
  // The bytes are copied with the CPU, so the tensors must live there even
  // when this thread allocates on a device by default.
  std::optional<AllocatorScope> host;
  if (CurrentAllocator()->device() != Device::kCpu) {
    host.emplace(DefaultCpuAllocator());
  }
  SafetensorsFile file;
  file.metadata = std::move(header.metadata);
  for (SafetensorsEntry& e : header.entries) {
    Tensor t = Tensor::Empty(Shape(std::move(e.shape)), e.dtype);
    if (t.nbytes() > 0) RETURN_IF_ERROR(fill(e, t.raw()));
    file.tensors.emplace(std::move(e.name), std::move(t));
  }
  return file;
}

}  // namespace

absl::Status WriteSafetensors(
    const std::string& path,
    const std::vector<std::pair<std::string, const Tensor*>>& tensors,
    const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(SafetensorsEncoder encoder,
                   SafetensorsEncoder::Create(tensors, metadata));
  ASSIGN_OR_RETURN(storage::AtomicFileWriter writer,
                   storage::AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(encoder.Encode(
      [&](std::string_view bytes) { return writer.Append(bytes); },
      size_t{64} << 20));
  return writer.Commit();
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path,
                                                storage::OtherDTypes other) {
  uint64_t file_size = 0;
  ASSIGN_OR_RETURN(storage::ScopedFd fd,
                   storage::OpenForRead(path, &file_size));
  ASSIGN_OR_RETURN(const std::string json,
                   storage::ReadHeaderJson(fd, path, file_size));
  const uint64_t data_start = storage::kHeaderLengthBytes + json.size();
  ASSIGN_OR_RETURN(SafetensorsHeader header,
                   storage::ParseSafetensorsHeader(json, file_size - data_start,
                                                   path, other));
  std::map<std::string, std::string> other_dtypes =
      std::move(header.other_dtypes);
  // Reading each tensor straight into its buffer keeps peak memory at one
  // copy of the weights, not two.
  ASSIGN_OR_RETURN(
      SafetensorsFile file,
      Materialize(std::move(header), [&](const SafetensorsEntry& e, void* dst) {
        return storage::ReadAt(fd, path, data_start + e.begin, dst,
                               e.end - e.begin);
      }));
  file.other_dtypes = std::move(other_dtypes);
  return file;
}

std::string OtherWeightsFormatHint(const std::string& path) {
  // Opened as the reader opens it: a FIFO named like weights blocked a
  // stream's open here until someone wrote to it (the worker and the
  // controller's submit hung with it).
  uint64_t size = 0;
  absl::StatusOr<storage::ScopedFd> fd = storage::OpenForRead(path, &size);
  char head[8] = {};
  if (!fd.ok() || size < sizeof head ||
      !storage::ReadAt(*fd, path, 0, head, sizeof head).ok()) {
    return "";
  }
  // A safetensors file, even a damaged one, starts with its header's
  // length: only a file whose first 8 bytes cannot be one is another format.
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i)
    header = header << 8 | static_cast<unsigned char>(head[i]);
  if (header <= size - std::min<uintmax_t>(size, 8)) return "";
  const std::string_view start(head, 4);
  constexpr const char* kConvert =
      "save the tensors with safetensors.torch.save_file(model.state_dict(), "
      "PATH), or gpipe.from_torch(model, PATH) for a model whose layers "
      "match";
  if (start == std::string_view("PK\x03\x04", 4)) {
    return absl::StrCat(
        " (it is a zip archive, as torch.save and numpy's .npz write: ",
        kConvert, ")");
  }
  if (head[0] == '\x80') {
    return absl::StrCat(
        " (it is a Python pickle, as an old torch.save "
        "writes: ",
        kConvert, ")");
  }
  return "";
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string_view bytes,
                                                 std::string_view what) {
  ASSIGN_OR_RETURN(
      const uint64_t header_size,
      storage::DecodeHeaderLength(bytes.substr(0, 8), bytes.size(), what));
  const size_t data_start = storage::kHeaderLengthBytes + header_size;
  ASSIGN_OR_RETURN(SafetensorsHeader header,
                   storage::ParseSafetensorsHeader(
                       bytes.substr(storage::kHeaderLengthBytes, header_size),
                       bytes.size() - data_start, what));
  return Materialize(
      std::move(header), [&](const SafetensorsEntry& e, void* dst) {
        std::memcpy(dst, bytes.data() + data_start + e.begin, e.end - e.begin);
        return absl::OkStatus();
      });
}

}  // namespace gpipe
