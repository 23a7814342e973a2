#include "services/storage/safetensors_stream.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/storage/json_header.h"
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

}  // namespace

absl::StatusOr<SafetensorsEncoder> SafetensorsEncoder::Create(
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

  SafetensorsEncoder encoder;
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
    encoder.data_.push_back(&t);
  }
  encoder.header_ = storage::EncodeSafetensorsHeader(header);
  encoder.size_ = encoder.header_.size() + offset;
  return encoder;
}

absl::Status SafetensorsEncoder::Encode(
    absl::FunctionRef<absl::Status(std::string_view)> append,
    size_t max_piece) const {
  max_piece = std::max<size_t>(max_piece, 1);
  RETURN_IF_ERROR(append(header_));
  for (const Tensor* t : data_) {
    const char* bytes = static_cast<const char*>(t->raw());
    for (size_t done = 0, n = t->nbytes(); done < n;) {
      const size_t piece = std::min(max_piece, n - done);
      RETURN_IF_ERROR(append(std::string_view(bytes + done, piece)));
      done += piece;
    }
  }
  return absl::OkStatus();
}

SafetensorsDecoder::SafetensorsDecoder(uint64_t file_size, std::string what)
    : file_size_(file_size), what_(std::move(what)) {}

absl::Status SafetensorsDecoder::ConsumeFraming(std::string_view& bytes) {
  const auto take = [&](uint64_t want) {
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(want - framing_.size(), bytes.size()));
    framing_.append(bytes.data(), n);
    bytes.remove_prefix(n);
  };
  if (header_size_ == 0) {
    take(storage::kHeaderLengthBytes);
    if (framing_.size() < storage::kHeaderLengthBytes) return absl::OkStatus();
    ASSIGN_OR_RETURN(header_size_,
                     storage::DecodeHeaderLength(framing_, file_size_, what_));
  }
  take(storage::kHeaderLengthBytes + header_size_);
  if (framing_.size() < storage::kHeaderLengthBytes + header_size_) {
    return absl::OkStatus();
  }
  const uint64_t data_size =
      file_size_ - storage::kHeaderLengthBytes - header_size_;
  ASSIGN_OR_RETURN(
      SafetensorsHeader header,
      storage::ParseSafetensorsHeader(
          std::string_view(framing_).substr(storage::kHeaderLengthBytes),
          data_size, what_));
  // The bytes are copied with the CPU, so the tensors live there even when
  // this thread allocates on a device by default.
  std::optional<AllocatorScope> host;
  if (CurrentAllocator()->device() != Device::kCpu) {
    host.emplace(DefaultCpuAllocator());
  }
  file_.metadata = std::move(header.metadata);
  // The parsed entries are in ascending offsets and tile the data buffer,
  // so the data arrives tensor after tensor.
  for (SafetensorsEntry& e : header.entries) {
    auto [it, inserted] = file_.tensors.emplace(
        std::move(e.name), Tensor::Empty(Shape(std::move(e.shape)), e.dtype));
    if (it->second.nbytes() > 0)
      data_.emplace_back(&it->second, e.end - e.begin);
  }
  framing_.clear();
  framing_.shrink_to_fit();
  have_header_ = true;
  return absl::OkStatus();
}

absl::Status SafetensorsDecoder::Consume(std::string_view bytes) {
  if (!failed_.ok()) return failed_;
  if (bytes.size() > file_size_ - consumed_) {
    failed_ = absl::DataLossError(
        absl::StrCat(what_, ": more than the ", file_size_, " bytes it has"));
    return failed_;
  }
  consumed_ += bytes.size();
  if (!have_header_) {
    if (absl::Status s = ConsumeFraming(bytes); !s.ok()) {
      failed_ = s;
      return s;
    }
  }
  while (!bytes.empty() && current_ < data_.size()) {
    auto [tensor, size] = data_[current_];
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(size - current_filled_, bytes.size()));
    std::memcpy(static_cast<char*>(tensor->raw()) + current_filled_,
                bytes.data(), n);
    bytes.remove_prefix(n);
    current_filled_ += n;
    if (current_filled_ == size) {
      ++current_;
      current_filled_ = 0;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsFile> SafetensorsDecoder::Finish() {
  if (!failed_.ok()) return failed_;
  if (consumed_ != file_size_ || !have_header_) {
    return absl::DataLossError(absl::StrCat(what_, ": ", consumed_, " of ",
                                            file_size_, " bytes arrived"));
  }
  return std::move(file_);
}

}  // namespace gpipe
