#include "services/storage/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/storage/file_io.h"
#include "services/storage/json_header.h"
#include "services/storage/safetensors_header.h"
#include "services/tensor/allocator.h"

namespace gpipe {
namespace {

using storage::QuoteForMessage;
using storage::SafetensorsEntry;
using storage::SafetensorsHeader;

// The format stores little-endian values, and we copy tensor bytes as is.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

absl::Status CheckTensor(const std::string& name, const Tensor* t) {
  const std::string quoted = QuoteForMessage(name);
  if (t == nullptr || !t->defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", quoted, " is null or undefined"));
  }
  if (t->device() != Device::kCpu) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor ", quoted, " is on ", AsAbsl(DeviceName(t->device())),
        "; copy it to the CPU before writing"));
  }
  for (const int64_t d : t->shape().dims()) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", quoted, " has a negative dimension in ",
                       t->shape().ToString()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckName(std::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("empty tensor name");
  if (name == "__metadata__") {
    return absl::InvalidArgumentError(
        "\"__metadata__\" is reserved and cannot name a tensor");
  }
  if (!storage::IsValidUtf8(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor name ", QuoteForMessage(name), " is not valid UTF-8"));
  }
  return absl::OkStatus();
}

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
  for (const auto& [key, value] : metadata) {
    if (!storage::IsValidUtf8(key) || !storage::IsValidUtf8(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata ", QuoteForMessage(key), " is not valid UTF-8"));
    }
  }
  std::vector<const std::pair<std::string, const Tensor*>*> sorted;
  sorted.reserve(tensors.size());
  for (const auto& named : tensors) {
    RETURN_IF_ERROR(CheckName(named.first));
    RETURN_IF_ERROR(CheckTensor(named.first, named.second));
    sorted.push_back(&named);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i - 1]->first == sorted[i]->first) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor name ", QuoteForMessage(sorted[i]->first), " appears twice"));
    }
  }

  SafetensorsHeader header;
  header.metadata = metadata;
  uint64_t offset = 0;
  for (const auto* named : sorted) {
    const Tensor& t = *named->second;
    SafetensorsEntry& e = header.entries.emplace_back();
    e.name = named->first;
    e.dtype = t.dtype();
    e.shape = t.shape().dims();
    e.begin = offset;
    offset += t.nbytes();
    e.end = offset;
  }

  ASSIGN_OR_RETURN(storage::AtomicFileWriter writer,
                   storage::AtomicFileWriter::Create(path));
  RETURN_IF_ERROR(writer.Append(storage::EncodeSafetensorsHeader(header)));
  for (const auto* named : sorted) {
    RETURN_IF_ERROR(
        writer.Append(named->second->raw(), named->second->nbytes()));
  }
  return writer.Commit();
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  uint64_t file_size = 0;
  ASSIGN_OR_RETURN(storage::ScopedFd fd,
                   storage::OpenForRead(path, &file_size));
  char prefix[storage::kHeaderLengthBytes];
  const size_t prefix_size = static_cast<size_t>(
      std::min<uint64_t>(file_size, storage::kHeaderLengthBytes));
  RETURN_IF_ERROR(storage::ReadAt(fd, path, 0, prefix, prefix_size));
  ASSIGN_OR_RETURN(const uint64_t header_size,
                   storage::DecodeHeaderLength(
                       std::string_view(prefix, prefix_size), file_size, path));
  std::string json(header_size, '\0');
  RETURN_IF_ERROR(storage::ReadAt(fd, path, storage::kHeaderLengthBytes,
                                  json.data(), json.size()));
  const uint64_t data_start = storage::kHeaderLengthBytes + header_size;
  ASSIGN_OR_RETURN(
      SafetensorsHeader header,
      storage::ParseSafetensorsHeader(json, file_size - data_start, path));
  // Reading each tensor straight into its buffer keeps peak memory at one
  // copy of the weights, not two.
  return Materialize(std::move(header),
                     [&](const SafetensorsEntry& e, void* dst) {
                       return storage::ReadAt(fd, path, data_start + e.begin,
                                              dst, e.end - e.begin);
                     });
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
