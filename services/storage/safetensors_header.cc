#include "services/storage/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/storage/json_header.h"

namespace gpipe::storage {
namespace {

using Token = JsonHeaderReader::Token;

constexpr uint64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

struct DTypeInfo {
  std::string_view name;
  size_t size;
};

// Every dtype the safetensors format defines. Knowing their sizes lets us
// tell a valid file we cannot hold (Unimplemented) from a corrupt one.
constexpr DTypeInfo kSafetensorsDTypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
    {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8},
};

std::optional<size_t> DTypeSizeByName(std::string_view name) {
  for (const DTypeInfo& info : kSafetensorsDTypes) {
    if (info.name == name) return info.size;
  }
  return std::nullopt;
}

absl::Status Malformed(std::string_view message) {
  return absl::InvalidArgumentError(AsAbsl(message));
}

// Prefixes a status's message, keeping its code.
absl::Status Annotate(const absl::Status& s, std::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(AsAbsl(prefix), s.message()));
}

std::string OffsetsString(const SafetensorsEntry& e) {
  return absl::StrCat("[", e.begin, ", ", e.end, "]");
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Reads the header by the schema it must follow. Errors come back as
// InvalidArgument (JSON and schema) or Unimplemented (dtype) without the
// file's name; ParseSafetensorsHeader maps them to what callers see.
class HeaderParser {
 public:
  HeaderParser(std::string_view json, uint64_t data_size, OtherDTypes other)
      : reader_(json), data_size_(data_size), other_(other) {}

  absl::StatusOr<SafetensorsHeader> Parse() {
    SafetensorsHeader header;
    if (reader_.Peek() != Token::kObject) {
      return Malformed("header is not a JSON object");
    }
    RETURN_IF_ERROR(reader_.BeginObject());
    std::string key;
    bool seen_metadata = false;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, reader_.NextMember(&key));
      if (!more) break;
      if (key == "__metadata__") {
        if (seen_metadata) return Malformed("\"__metadata__\" appears twice");
        seen_metadata = true;
        absl::Status s = ParseMetadata(&header.metadata);
        if (!s.ok()) return Annotate(s, "\"__metadata__\": ");
        continue;
      }
      SafetensorsEntry entry;
      entry.name = std::move(key);
      absl::Status s = ParseEntry(&entry);
      if (!s.ok()) {
        return Annotate(
            s, absl::StrCat("tensor ", QuoteForMessage(entry.name), ": "));
      }
      header.entries.push_back(std::move(entry));
    }
    RETURN_IF_ERROR(reader_.Finish());
    RETURN_IF_ERROR(CheckLayout(&header.entries));
    if (!unsupported_.empty()) {
      // Only once the whole header checks out, so a corrupt file is
      // DataLoss whatever its dtypes.
      if (other_ == OtherDTypes::kRefuse) {
        return absl::UnimplementedError(
            absl::StrCat("tensor ", QuoteForMessage(unsupported_[0].first),
                         ": dtype ", unsupported_[0].second,
                         " is not supported (only F32, and I32 for integers)"));
      }
      for (const auto& [name, dtype] : unsupported_) {
        header.other_dtypes[name] = dtype;
      }
      std::erase_if(header.entries, [&](const SafetensorsEntry& e) {
        return header.other_dtypes.count(e.name) > 0;
      });
    }
    return header;
  }

 private:
  absl::Status ParseMetadata(std::map<std::string, std::string>* metadata) {
    if (reader_.Peek() != Token::kObject) return Malformed("not an object");
    RETURN_IF_ERROR(reader_.BeginObject());
    std::string key;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, reader_.NextMember(&key));
      if (!more) return absl::OkStatus();
      if (reader_.Peek() != Token::kString) {
        return Malformed(absl::StrCat("value of ", QuoteForMessage(key),
                                      " is not a string"));
      }
      ASSIGN_OR_RETURN(std::string value, reader_.ReadString());
      if (!metadata->emplace(key, std::move(value)).second) {
        return Malformed(
            absl::StrCat("key ", QuoteForMessage(key), " appears twice"));
      }
    }
  }

  absl::Status ParseEntry(SafetensorsEntry* entry) {
    if (entry->name.empty()) return Malformed("empty tensor name");
    if (reader_.Peek() != Token::kObject) return Malformed("not an object");
    RETURN_IF_ERROR(reader_.BeginObject());
    std::optional<std::string> dtype;
    bool has_shape = false, has_offsets = false;
    std::string key;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, reader_.NextMember(&key));
      if (!more) break;
      if (key == "dtype") {
        if (dtype) return Malformed("\"dtype\" appears twice");
        if (reader_.Peek() != Token::kString) {
          return Malformed("\"dtype\" is not a string");
        }
        ASSIGN_OR_RETURN(dtype, reader_.ReadString());
      } else if (key == "shape") {
        if (has_shape) return Malformed("\"shape\" appears twice");
        has_shape = true;
        RETURN_IF_ERROR(ParseShape(&entry->shape));
      } else if (key == "data_offsets") {
        if (has_offsets) return Malformed("\"data_offsets\" appears twice");
        has_offsets = true;
        RETURN_IF_ERROR(ParseOffsets(entry));
      } else {
        return Malformed(absl::StrCat("unexpected key ", QuoteForMessage(key)));
      }
    }
    if (!dtype) return Malformed("missing \"dtype\"");
    if (!has_shape) return Malformed("missing \"shape\"");
    if (!has_offsets) return Malformed("missing \"data_offsets\"");
    return CheckSize(*dtype, entry);
  }

  absl::Status ParseShape(std::vector<int64_t>* shape) {
    if (reader_.Peek() != Token::kArray) {
      return Malformed("\"shape\" is not an array");
    }
    RETURN_IF_ERROR(reader_.BeginArray());
    while (true) {
      ASSIGN_OR_RETURN(const bool more, reader_.NextElement());
      if (!more) return absl::OkStatus();
      if (reader_.Peek() != Token::kInteger) {
        return Malformed(
            "\"shape\" holds something other than a non-negative "
            "integer");
      }
      ASSIGN_OR_RETURN(const uint64_t dim, reader_.ReadInteger());
      if (dim > kMaxInt64) return Malformed("dimension too large");
      shape->push_back(static_cast<int64_t>(dim));
    }
  }

  absl::Status ParseOffsets(SafetensorsEntry* entry) {
    const absl::Status wrong = Malformed(
        "\"data_offsets\" is not an array of two non-negative "
        "integers");
    if (reader_.Peek() != Token::kArray) return wrong;
    RETURN_IF_ERROR(reader_.BeginArray());
    uint64_t offsets[2];
    for (uint64_t& offset : offsets) {
      ASSIGN_OR_RETURN(const bool more, reader_.NextElement());
      if (!more || reader_.Peek() != Token::kInteger) return wrong;
      ASSIGN_OR_RETURN(offset, reader_.ReadInteger());
    }
    ASSIGN_OR_RETURN(const bool more, reader_.NextElement());
    if (more) return wrong;
    entry->begin = offsets[0];
    entry->end = offsets[1];
    return absl::OkStatus();
  }

  // The entry's range lies in the buffer and is exactly its shape's size.
  absl::Status CheckSize(const std::string& dtype, SafetensorsEntry* entry) {
    const std::optional<size_t> elem = DTypeSizeByName(dtype);
    if (!elem) {
      return Malformed(absl::StrCat("unknown dtype ", QuoteForMessage(dtype)));
    }
    if (entry->begin > entry->end || entry->end > data_size_) {
      return Malformed(absl::StrCat("data_offsets ", OffsetsString(*entry),
                                    " out of range for a data buffer of ",
                                    data_size_, " bytes"));
    }
    // The product of the nonzero dims must fit int64_t, or Shape::numel()
    // would overflow on its way to a zero dim.
    uint64_t numel = 1;
    bool has_zero = false;
    for (const int64_t d : entry->shape) {
      if (d == 0) {
        has_zero = true;
      } else if (numel > kMaxInt64 / static_cast<uint64_t>(d)) {
        return Malformed(absl::StrCat("shape ", ShapeString(entry->shape),
                                      " has too many elements"));
      } else {
        numel *= d;
      }
    }
    if (has_zero) numel = 0;
    const uint64_t size = entry->end - entry->begin;
    if (numel > std::numeric_limits<uint64_t>::max() / *elem ||
        numel * *elem != size) {
      const std::string bytes =
          numel > std::numeric_limits<uint64_t>::max() / *elem
              ? "more than 2^64 bytes"
              : absl::StrCat(numel * *elem, " bytes");
      return Malformed(absl::StrCat(
          "data_offsets ", OffsetsString(*entry), " do not match shape ",
          ShapeString(entry->shape), " (", bytes, ")"));
    }
    if (dtype == "F32") {
      entry->dtype = DType::kF32;
    } else if (dtype == "I32") {
      entry->dtype = DType::kI32;
    } else {
      unsupported_.push_back({entry->name, dtype});  // judged in Parse
    }
    return absl::OkStatus();
  }

  // Names unique; byte ranges tile [0, data_size) in some order.
  absl::Status CheckLayout(std::vector<SafetensorsEntry>* entries) {
    std::vector<const SafetensorsEntry*> by_name;
    by_name.reserve(entries->size());
    for (const SafetensorsEntry& e : *entries) by_name.push_back(&e);
    std::sort(by_name.begin(), by_name.end(),
              [](const auto* a, const auto* b) { return a->name < b->name; });
    for (size_t i = 1; i < by_name.size(); ++i) {
      if (by_name[i - 1]->name == by_name[i]->name) {
        return Malformed(absl::StrCat(
            "tensor ", QuoteForMessage(by_name[i]->name), " appears twice"));
      }
    }
    std::sort(entries->begin(), entries->end(),
              [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
              });
    uint64_t covered = 0;  // end of the previous range
    const SafetensorsEntry* previous = nullptr;
    for (const SafetensorsEntry& e : *entries) {
      if (e.begin < covered) {
        return Malformed(
            absl::StrCat("tensors ", QuoteForMessage(previous->name), " and ",
                         QuoteForMessage(e.name), " overlap: data_offsets ",
                         OffsetsString(*previous), " and ", OffsetsString(e)));
      }
      if (e.begin > covered) {
        return Malformed(absl::StrCat(
            "gap in the data buffer: bytes [", covered, ", ", e.begin,
            ") belong to no tensor (next is ", QuoteForMessage(e.name), ")"));
      }
      covered = e.end;
      previous = &e;
    }
    if (covered != data_size_) {
      return Malformed(absl::StrCat("data buffer has ", data_size_,
                                    " bytes but the tensors cover only ",
                                    covered));
    }
    return absl::OkStatus();
  }

  JsonHeaderReader reader_;
  const uint64_t data_size_;
  const OtherDTypes other_;
  std::vector<std::pair<std::string, std::string>> unsupported_;  // name, dtype
};

}  // namespace

std::string_view SafetensorsDTypeName(DType dtype) {
  return dtype == DType::kF32 ? "F32" : "I32";
}

absl::StatusOr<uint64_t> DecodeHeaderLength(std::string_view prefix,
                                            uint64_t file_size,
                                            std::string_view what) {
  if (file_size < kHeaderLengthBytes || prefix.size() < kHeaderLengthBytes) {
    return absl::DataLossError(
        absl::StrCat(AsAbsl(what), ": file is ", file_size,
                     " bytes, too short for the 8-byte header length"));
  }
  uint64_t n = 0;
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
    n |= uint64_t{static_cast<unsigned char>(prefix[i])} << (8 * i);
  }
  if (n > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat(AsAbsl(what), ": header length ", n,
                                            " exceeds the limit of ",
                                            kMaxHeaderBytes, " bytes"));
  }
  if (n > file_size - kHeaderLengthBytes) {
    return absl::DataLossError(
        absl::StrCat(AsAbsl(what), ": header length ", n, " is more than the ",
                     file_size - kHeaderLengthBytes,
                     " bytes that follow it (file truncated?)"));
  }
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view json,
                                                         uint64_t data_size,
                                                         std::string_view what,
                                                         OtherDTypes other) {
  absl::StatusOr<SafetensorsHeader> header =
      HeaderParser(json, data_size, other).Parse();
  if (header.ok()) return header;
  const std::string message =
      absl::StrCat(AsAbsl(what), ": ", header.status().message());
  if (header.status().code() == absl::StatusCode::kUnimplemented) {
    return absl::UnimplementedError(message);
  }
  return absl::DataLossError(message);
}

std::string EncodeSafetensorsHeader(const SafetensorsHeader& header) {
  std::string json = "{";
  if (!header.metadata.empty()) {
    json += "\"__metadata__\":{";
    const char* sep = "";
    for (const auto& [key, value] : header.metadata) {
      json += sep;
      AppendJsonString(key, &json);
      json += ':';
      AppendJsonString(value, &json);
      sep = ",";
    }
    json += '}';
  }
  for (size_t i = 0; i < header.entries.size(); ++i) {
    const SafetensorsEntry& e = header.entries[i];
    if (i > 0 || !header.metadata.empty()) json += ',';
    AppendJsonString(e.name, &json);
    absl::StrAppend(&json, ":{\"dtype\":\"",
                    AsAbsl(SafetensorsDTypeName(e.dtype)), "\",\"shape\":[",
                    absl::StrJoin(e.shape, ","), "],\"data_offsets\":[",
                    e.begin, ",", e.end, "]}");
  }
  json += '}';
  // Aligned data lets readers that map the file use it in place.
  const size_t unaligned = (kHeaderLengthBytes + json.size()) % 8;
  if (unaligned != 0) json.append(8 - unaligned, ' ');

  std::string out(kHeaderLengthBytes, '\0');
  for (size_t i = 0; i < kHeaderLengthBytes; ++i) {
    out[i] = static_cast<char>((uint64_t{json.size()} >> (8 * i)) & 0xFF);
  }
  out += json;
  return out;
}

absl::StatusOr<std::string> ReadHeaderJson(const ScopedFd& fd,
                                           const std::string& path,
                                           uint64_t file_size) {
  char prefix[kHeaderLengthBytes];
  const size_t prefix_size =
      static_cast<size_t>(std::min<uint64_t>(file_size, kHeaderLengthBytes));
  RETURN_IF_ERROR(ReadAt(fd, path, 0, prefix, prefix_size));
  ASSIGN_OR_RETURN(const uint64_t length,
                   DecodeHeaderLength(std::string_view(prefix, prefix_size),
                                      file_size, path));
  std::string json(static_cast<size_t>(length), '\0');
  RETURN_IF_ERROR(
      ReadAt(fd, path, kHeaderLengthBytes, json.data(), json.size()));
  return json;
}

namespace {

// JSON's escapes, and \xNN for each byte that is no part of a UTF-8
// character: a binary file's raw bytes reached the terminal in messages.
void AppendQuoted(std::string_view s, std::string* out) {
  if (IsValidUtf8(s)) {
    AppendJsonString(s, out);
    return;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    while (n <= 4 && i + n <= s.size() && !IsValidUtf8(s.substr(i, n))) ++n;
    if (n > 4 || i + n > s.size()) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      out->append("\\x");
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 0xF]);
      ++i;
      continue;
    }
    std::string one;
    AppendJsonString(s.substr(i, n), &one);
    out->append(one, 1, one.size() - 2);  // without its quotes
    i += n;
  }
  out->push_back('"');
}

}  // namespace

std::string QuoteForMessage(std::string_view s) {
  constexpr size_t kMaxBytes = 200;
  std::string out;
  if (s.size() <= kMaxBytes) {
    AppendQuoted(s, &out);
    return out;
  }
  AppendQuoted(Utf8Prefix(s, kMaxBytes), &out);
  out += "...";
  return out;
}

}  // namespace gpipe::storage
