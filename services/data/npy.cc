#include "services/data/npy.h"

#include <algorithm>
#include <cctype>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/storage/file_io.h"

namespace gpipe {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// Magic, two version bytes and the shortest (2-byte) header length.
constexpr size_t kPreambleBytes = 10;
// np.save writes headers of a few hundred bytes and np.load refuses ones
// past 10000 by default; a longer one is corrupt, not a big array.
constexpr uint64_t kMaxHeaderBytes = 1 << 20;

absl::Status Malformed(std::string_view what) {
  return absl::InvalidArgumentError(AsAbsl(what));
}

// The dtype a descr such as "<f4" or "|u1" names.
absl::StatusOr<ElementType> ParseDescr(const std::string& descr) {
  const std::string quoted = absl::StrCat("'", descr, "'");
  if (descr.size() < 2 ||
      std::string_view("<>|=").find(descr[0]) == std::string_view::npos) {
    return Malformed(absl::StrCat("malformed dtype ", quoted));
  }
  const char order = descr[0];
  const char kind = descr[1];
  const std::string size = descr.substr(2);
  const std::string_view why = [&]() -> std::string_view {
    switch (kind) {
      case 'O':
        return "object arrays";
      case 'U':
      case 'S':
      case 'a':
        return "strings";
      case 'V':
        return "void or structured arrays";
      case 'c':
        return "complex numbers";
      case 'M':
      case 'm':
        return "dates and times";
      default:
        return "";
    }
  }();
  if (!why.empty()) {
    return Malformed(absl::StrCat("dtype ", quoted, " (", AsAbsl(why),
                                  ") is not supported; save a numeric array"));
  }
  static constexpr std::pair<std::string_view, ElementType> kTypes[] = {
      {"b1", ElementType::kBool}, {"u1", ElementType::kU8},
      {"i1", ElementType::kI8},   {"u2", ElementType::kU16},
      {"i2", ElementType::kI16},  {"u4", ElementType::kU32},
      {"i4", ElementType::kI32},  {"u8", ElementType::kU64},
      {"i8", ElementType::kI64},  {"f2", ElementType::kF16},
      {"f4", ElementType::kF32},  {"f8", ElementType::kF64},
  };
  const std::string kind_size = absl::StrCat(std::string(1, kind), size);
  const auto it =
      std::find_if(std::begin(kTypes), std::end(kTypes),
                   [&](const auto& t) { return t.first == kind_size; });
  if (it == std::end(kTypes)) {
    return Malformed(absl::StrCat(
        "dtype ", quoted,
        " is not supported (bool, int8-64, uint8-64 or float16-64 are)"));
  }
  const ElementType type = it->second;
  if (ElementSize(type) > 1) {
    if (order == '>') {
      return Malformed(absl::StrCat("big-endian dtype ", quoted,
                                    " is not supported; save with "
                                    "arr.astype('<",
                                    kind_size, "')"));
    }
    // '|' means "byte order does not apply", which is false of a
    // multi-byte type. '=' is the writer's native order; np.save always
    // spells it out, and every machine NumPy runs on in practice is
    // little-endian, so it is read as '<'.
    if (order == '|') {
      return Malformed(absl::StrCat("dtype ", quoted,
                                    ": byte order '|' is only meaningful for "
                                    "one-byte types"));
    }
  }
  return type;
}

// A strict reader of the one dict literal np.save writes, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderDictParser {
 public:
  explicit HeaderDictParser(std::string_view text) : text_(text) {}

  absl::Status Parse(NpyHeader* header) {
    SkipSpace();
    if (!Consume('{')) return Error("the header is not a dict");
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    bool has_shape = false;
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      ASSIGN_OR_RETURN(const std::string key, ReadString());
      SkipSpace();
      if (!Consume(':')) return Error("expected ':' after a key");
      SkipSpace();
      if (key == "descr") {
        if (descr) return Error("'descr' appears twice");
        if (Peek() == '[') {
          return Malformed(
              "structured dtypes (a list of fields) are not supported; save "
              "a plain numeric array");
        }
        ASSIGN_OR_RETURN(descr, ReadString());
      } else if (key == "fortran_order") {
        if (fortran_order) return Error("'fortran_order' appears twice");
        ASSIGN_OR_RETURN(fortran_order, ReadBool());
      } else if (key == "shape") {
        if (has_shape) return Error("'shape' appears twice");
        has_shape = true;
        RETURN_IF_ERROR(ReadShape(&header->shape));
      } else {
        return Error(absl::StrCat("unexpected key '", key, "'"));
      }
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) break;
      return Error("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("text after the dict");
    if (!descr) return Malformed("header: missing 'descr'");
    if (!fortran_order) return Malformed("header: missing 'fortran_order'");
    if (!has_shape) return Malformed("header: missing 'shape'");
    ASSIGN_OR_RETURN(header->type, ParseDescr(*descr));
    // A column-major array of rank < 2 has the same bytes as a row-major
    // one; np.save marks only true Fortran layouts, but refusing all keeps
    // the rule simple to state.
    if (*fortran_order) {
      return Malformed(
          "fortran_order arrays are not supported; save with "
          "np.ascontiguousarray");
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(std::string_view what) const {
    return Malformed(
        absl::StrCat("malformed header at byte ", pos_, ": ", AsAbsl(what)));
  }
  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool Consume(char c) {
    if (Peek() != c || pos_ >= text_.size()) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (pos_ < text_.size() &&
           std::isspace(static_cast<unsigned char>(text_[pos_]))) {
      ++pos_;
    }
  }

  absl::StatusOr<std::string> ReadString() {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return Error("expected a string");
    ++pos_;
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return Error("unterminated string");
    const std::string_view s = text_.substr(pos_, end - pos_);
    // np.save never escapes anything; a backslash means a hand-made header.
    if (s.find('\\') != std::string_view::npos) {
      return Error("escapes in strings are not supported");
    }
    pos_ = end + 1;
    return std::string(s);
  }

  absl::StatusOr<bool> ReadBool() {
    for (const auto& [word, value] :
         {std::pair{std::string_view("True"), true},
          std::pair{std::string_view("False"), false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    return Error("'fortran_order' is not True or False");
  }

  absl::Status ReadShape(std::vector<int64_t>* shape) {
    if (!Consume('(')) return Error("'shape' is not a tuple");
    while (true) {
      SkipSpace();
      if (Consume(')')) return absl::OkStatus();
      if (!std::isdigit(static_cast<unsigned char>(Peek()))) {
        return Error(
            "'shape' holds something other than a non-negative "
            "integer");
      }
      int64_t d = 0;
      while (std::isdigit(static_cast<unsigned char>(Peek()))) {
        const int digit = Peek() - '0';
        if (d > (std::numeric_limits<int64_t>::max() - digit) / 10) {
          return Error("a dimension in 'shape' is too large");
        }
        d = d * 10 + digit;
        ++pos_;
      }
      Consume('L');  // Python 2 wrote long integers so
      shape->push_back(d);
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume(')')) return absl::OkStatus();
      return Error("expected ',' or ')' in 'shape'");
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

uint64_t LittleEndian(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    v |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  }
  return v;
}

absl::Status WithPath(const std::string& path, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

}  // namespace

absl::StatusOr<NpyHeader> ParseNpyHeader(std::string_view bytes) {
  if (bytes.size() < kMagic.size() ||
      bytes.substr(0, kMagic.size()) != kMagic) {
    return Malformed("not a .npy file (it does not start with \"\\x93NUMPY\")");
  }
  if (bytes.size() < kPreambleBytes) {
    return Malformed(absl::StrCat("truncated: ", bytes.size(),
                                  " bytes, shorter than the .npy preamble"));
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return Malformed(absl::StrCat("format version ", major, ".", minor,
                                  " is not supported (1.0, 2.0 and 3.0 are)"));
  }
  // Version 1 has a 2-byte header length, later ones 4 bytes.
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t preamble = 8 + length_bytes;
  if (bytes.size() < preamble) {
    return Malformed(absl::StrCat("truncated: ", bytes.size(),
                                  " bytes, shorter than the .npy preamble"));
  }
  const uint64_t header_bytes = LittleEndian(bytes.substr(8, length_bytes));
  if (header_bytes > kMaxHeaderBytes) {
    return Malformed(absl::StrCat("header length ", header_bytes,
                                  " is past the limit of ", kMaxHeaderBytes,
                                  " bytes (corrupt file?)"));
  }
  if (header_bytes > bytes.size() - preamble) {
    return Malformed(absl::StrCat(
        "truncated: the header is ", header_bytes, " bytes, the file has ",
        bytes.size() - preamble, " after the preamble"));
  }
  NpyHeader header;
  RETURN_IF_ERROR(
      HeaderDictParser(bytes.substr(preamble, header_bytes)).Parse(&header));
  ASSIGN_OR_RETURN(const int64_t numel,
                   CheckedNumel(header.shape, ElementSize(header.type)));
  header.data_offset = preamble + header_bytes;
  header.data_bytes = static_cast<uint64_t>(numel) * ElementSize(header.type);
  return header;
}

absl::StatusOr<NumericArray> ReadNpy(const std::string& path) {
  uint64_t size = 0;
  ASSIGN_OR_RETURN(storage::ScopedFd fd, storage::OpenForRead(path, &size));
  // The preamble, then as much of the header as it announces.
  std::string head(static_cast<size_t>(std::min<uint64_t>(size, 12)), '\0');
  RETURN_IF_ERROR(storage::ReadAt(fd, path, 0, head.data(), head.size()));
  if (head.size() >= kPreambleBytes && head.substr(0, 6) == kMagic) {
    const size_t length_bytes = head[6] == 1 ? 2 : 4;
    if (head.size() >= 8 + length_bytes) {
      const uint64_t header_bytes =
          LittleEndian(std::string_view(head).substr(8, length_bytes));
      const uint64_t want = std::min<uint64_t>(
          size, 8 + length_bytes + std::min(header_bytes, kMaxHeaderBytes));
      head.resize(static_cast<size_t>(want));
      RETURN_IF_ERROR(storage::ReadAt(fd, path, 0, head.data(), head.size()));
    }
  }
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(head);
  if (!header.ok()) return WithPath(path, header.status());
  const uint64_t have = size - header->data_offset;
  if (have != header->data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", have < header->data_bytes ? "truncated: " : "",
        "the header promises ", header->data_bytes,
        " bytes of data, the file has ", have, " (",
        AsAbsl(ElementTypeName(header->type)), " ",
        ShapeToString(header->shape),
        have > header->data_bytes ? "; more than one array in the file?)"
                                  : ")"));
  }
  NumericArray array;
  array.type = header->type;
  array.shape = std::move(header->shape);
  array.data.resize(static_cast<size_t>(have));
  RETURN_IF_ERROR(
      storage::ReadAt(fd, path, header->data_offset, array.data.data(), have));
  return array;
}

std::string EncodeNpyF32(const std::vector<int64_t>& shape,
                         const float* values) {
  int64_t count = 1;
  std::string dims;
  for (int64_t d : shape) {
    count *= d;
    absl::StrAppend(&dims, d, ", ");
  }
  // Python's tuple: "(3,)" for one dimension, "(2, 3)" for two.
  if (shape.size() == 1) dims.pop_back();
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string dict = absl::StrCat(
      "{'descr': '<f4', 'fortran_order': False, "
      "'shape': (",
      dims, "), }");
  // Padded with spaces so that the data starts on a multiple of 64 bytes,
  // the header ending in a newline.
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  out += dict;
  static_assert(std::numeric_limits<float>::is_iec559);
  out.append(reinterpret_cast<const char*>(values),
             static_cast<size_t>(count) * sizeof(float));
  return out;
}

}  // namespace gpipe
