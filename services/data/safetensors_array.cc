#include "services/data/safetensors_array.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/storage/file_io.h"
#include "services/storage/json_header.h"
#include "services/storage/safetensors_header.h"

namespace gpipe {
namespace {

using storage::JsonHeaderReader;
using storage::QuoteForMessage;
using Token = JsonHeaderReader::Token;

// Every dtype the format defines; nullopt for those we cannot convert.
struct DTypeInfo {
  std::string_view name;
  size_t size;
  std::optional<ElementType> type;
};
constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 1, ElementType::kBool}, {"U8", 1, ElementType::kU8},
    {"I8", 1, ElementType::kI8},     {"F8_E5M2", 1, std::nullopt},
    {"F8_E4M3", 1, std::nullopt},    {"U16", 2, ElementType::kU16},
    {"I16", 2, ElementType::kI16},   {"F16", 2, ElementType::kF16},
    {"BF16", 2, ElementType::kBF16}, {"U32", 4, ElementType::kU32},
    {"I32", 4, ElementType::kI32},   {"F32", 4, ElementType::kF32},
    {"U64", 8, ElementType::kU64},   {"I64", 8, ElementType::kI64},
    {"F64", 8, ElementType::kF64},
};

struct Entry {
  std::string name;
  const DTypeInfo* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

absl::Status Malformed(std::string_view what) {
  return absl::InvalidArgumentError(AsAbsl(what));
}

// Reads the header by its schema: {name: {dtype, shape, data_offsets}} and
// an optional "__metadata__" of strings, which is skipped.
class HeaderParser {
 public:
  HeaderParser(std::string_view json, uint64_t data_size)
      : reader_(json), data_size_(data_size) {}

  absl::StatusOr<std::vector<Entry>> Parse() {
    if (reader_.Peek() != Token::kObject) {
      return Malformed("header is not a JSON object");
    }
    RETURN_IF_ERROR(reader_.BeginObject());
    std::vector<Entry> entries;
    std::string key;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, reader_.NextMember(&key));
      if (!more) break;
      if (key == "__metadata__") {
        RETURN_IF_ERROR(SkipMetadata());
        continue;
      }
      Entry e;
      e.name = std::move(key);
      absl::Status s = ParseEntry(&e);
      if (!s.ok()) {
        return Malformed(absl::StrCat("tensor ", QuoteForMessage(e.name), ": ",
                                      s.message()));
      }
      entries.push_back(std::move(e));
    }
    RETURN_IF_ERROR(reader_.Finish());
    return entries;
  }

 private:
  absl::Status SkipMetadata() {
    if (reader_.Peek() != Token::kObject) {
      return Malformed("\"__metadata__\" is not an object");
    }
    RETURN_IF_ERROR(reader_.BeginObject());
    std::string key;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, reader_.NextMember(&key));
      if (!more) return absl::OkStatus();
      if (reader_.Peek() != Token::kString) {
        return Malformed("\"__metadata__\" holds a value that is not a string");
      }
      RETURN_IF_ERROR(reader_.ReadString().status());
    }
  }

  absl::Status ParseEntry(Entry* e) {
    if (reader_.Peek() != Token::kObject) return Malformed("not an object");
    RETURN_IF_ERROR(reader_.BeginObject());
    bool has_shape = false, has_offsets = false;
    std::string key;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, reader_.NextMember(&key));
      if (!more) break;
      if (key == "dtype" && e->dtype == nullptr) {
        if (reader_.Peek() != Token::kString) {
          return Malformed("\"dtype\" is not a string");
        }
        ASSIGN_OR_RETURN(const std::string name, reader_.ReadString());
        for (const DTypeInfo& d : kDTypes) {
          if (d.name == name) e->dtype = &d;
        }
        if (e->dtype == nullptr) {
          return Malformed(
              absl::StrCat("unknown dtype ", QuoteForMessage(name)));
        }
      } else if (key == "shape" && !has_shape) {
        has_shape = true;
        if (reader_.Peek() != Token::kArray) {
          return Malformed("\"shape\" is not an array");
        }
        RETURN_IF_ERROR(reader_.BeginArray());
        while (true) {
          ASSIGN_OR_RETURN(const bool element, reader_.NextElement());
          if (!element) break;
          if (reader_.Peek() != Token::kInteger) {
            return Malformed("\"shape\" holds a non-integer");
          }
          ASSIGN_OR_RETURN(const uint64_t d, reader_.ReadInteger());
          if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            return Malformed("a dimension is too large");
          }
          e->shape.push_back(static_cast<int64_t>(d));
        }
      } else if (key == "data_offsets" && !has_offsets) {
        has_offsets = true;
        const absl::Status wrong = Malformed(
            "\"data_offsets\" is not an array of two non-negative integers");
        if (reader_.Peek() != Token::kArray) return wrong;
        RETURN_IF_ERROR(reader_.BeginArray());
        for (uint64_t* offset : {&e->begin, &e->end}) {
          ASSIGN_OR_RETURN(const bool element, reader_.NextElement());
          if (!element || reader_.Peek() != Token::kInteger) return wrong;
          ASSIGN_OR_RETURN(*offset, reader_.ReadInteger());
        }
        ASSIGN_OR_RETURN(const bool extra, reader_.NextElement());
        if (extra) return wrong;
      } else {
        return Malformed(
            absl::StrCat("unexpected or repeated key ", QuoteForMessage(key)));
      }
    }
    if (e->dtype == nullptr) return Malformed("missing \"dtype\"");
    if (!has_shape) return Malformed("missing \"shape\"");
    if (!has_offsets) return Malformed("missing \"data_offsets\"");
    ASSIGN_OR_RETURN(const int64_t numel,
                     CheckedNumel(e->shape, e->dtype->size));
    const uint64_t bytes = static_cast<uint64_t>(numel) * e->dtype->size;
    if (e->begin > e->end || e->end > data_size_ ||
        e->end - e->begin != bytes) {
      return Malformed(absl::StrCat(
          "data_offsets [", e->begin, ", ", e->end, "] do not hold ",
          AsAbsl(e->dtype->name), " ", ShapeToString(e->shape), " (", bytes,
          " bytes) in a data buffer of ", data_size_, " bytes"));
    }
    return absl::OkStatus();
  }

  JsonHeaderReader reader_;
  const uint64_t data_size_;
};

absl::Status Bad(const std::string& path, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", AsAbsl(what)));
}

}  // namespace

absl::StatusOr<NumericArray> ReadSafetensorsArray(const std::string& path,
                                                  const std::string& name) {
  uint64_t size = 0;
  ASSIGN_OR_RETURN(storage::ScopedFd fd, storage::OpenForRead(path, &size));
  absl::StatusOr<std::string> json = storage::ReadHeaderJson(fd, path, size);
  if (!json.ok()) {
    // DataLoss there; a malformed data file is InvalidArgument here, as
    // every other data set has it.
    return absl::InvalidArgumentError(json.status().message());
  }
  const uint64_t data_start = storage::kHeaderLengthBytes + json->size();
  absl::StatusOr<std::vector<Entry>> entries =
      HeaderParser(*json, size - data_start).Parse();
  if (!entries.ok()) {
    return Bad(path,
               absl::StrCat("malformed header: ", entries.status().message()));
  }
  const Entry* found = nullptr;
  std::vector<std::string> names;
  for (const Entry& e : *entries) {
    if (e.name == name) found = &e;
    names.push_back(QuoteForMessage(e.name));
  }
  if (found == nullptr) {
    constexpr size_t kMaxNames = 20;
    std::string listed;
    if (names.empty()) {
      listed = "no tensors";
    } else if (names.size() <= kMaxNames) {
      listed = absl::StrCat("the tensors ", absl::StrJoin(names, ", "));
    } else {
      names.resize(kMaxNames);
      listed = absl::StrCat("the tensors ", absl::StrJoin(names, ", "), " and ",
                            entries->size() - kMaxNames, " more");
    }
    return Bad(path, absl::StrCat("no tensor ", QuoteForMessage(name),
                                  "; the file has ", listed));
  }
  if (!found->dtype->type) {
    return Bad(path,
               absl::StrCat("tensor ", QuoteForMessage(name), ": dtype ",
                            AsAbsl(found->dtype->name), " is not supported"));
  }
  NumericArray array;
  array.type = *found->dtype->type;
  array.shape = found->shape;
  array.data.resize(static_cast<size_t>(found->end - found->begin));
  RETURN_IF_ERROR(storage::ReadAt(fd, path, data_start + found->begin,
                                  array.data.data(), array.data.size()));
  return array;
}

}  // namespace gpipe
