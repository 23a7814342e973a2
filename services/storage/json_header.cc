#include "services/storage/json_header.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"

namespace gpipe::storage {
namespace {

// Returns the length of the well-formed UTF-8 sequence starting at s[i], or 0
// when there is none (Unicode 15, table 3-7).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  // 0x100 lies outside every byte range below, so reading past the end fails.
  const auto byte = [&](size_t k) -> unsigned {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0x100;
  };
  const unsigned c = byte(0);
  if (c < 0x80) return 1;
  unsigned lo = 0x80, hi = 0xBF;
  size_t n;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (byte(1) < lo || byte(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(k) < 0x80 || byte(k) > 0xBF) return 0;
  }
  return n;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

JsonHeaderReader::Token JsonHeaderReader::Peek() {
  SkipWhitespace();
  if (pos_ >= text_.size()) return Token::kEnd;
  const char c = text_[pos_];
  if (c == '{') return Token::kObject;
  if (c == '[') return Token::kArray;
  if (c == '"') return Token::kString;
  if (IsDigit(c)) return Token::kInteger;
  return Token::kOther;
}

absl::Status JsonHeaderReader::BeginObject() {
  SkipWhitespace();
  RETURN_IF_ERROR(Expect('{'));
  open_.push_back({'}', true});
  return absl::OkStatus();
}

// Steps to the next entry of the innermost open container, whose closing
// character is `close`: false (and the container closed) at its end.
absl::StatusOr<bool> JsonHeaderReader::NextEntry(char close) {
  if (open_.empty() || open_.back().close != close) {
    return absl::FailedPreconditionError(close == '}'
                                             ? "NextMember outside an object"
                                             : "NextElement outside an array");
  }
  SkipWhitespace();
  if (pos_ < text_.size() && text_[pos_] == close) {
    ++pos_;
    open_.pop_back();
    return false;
  }
  if (open_.back().first) {
    open_.back().first = false;
    return true;
  }
  if (pos_ >= text_.size() || text_[pos_] != ',') {
    return Error(close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
  }
  ++pos_;
  // "{"a":1,}" fails when the key is read ('}' is not a string); "[1,]"
  // must fail here, since ']' could otherwise end the array.
  SkipWhitespace();
  if (close == ']' && pos_ < text_.size() && text_[pos_] == ']') {
    return Error("trailing ',' in array");
  }
  return true;
}

absl::StatusOr<bool> JsonHeaderReader::NextMember(std::string* key) {
  ASSIGN_OR_RETURN(const bool more, NextEntry('}'));
  if (!more) return false;
  ASSIGN_OR_RETURN(*key, ReadString());
  SkipWhitespace();
  RETURN_IF_ERROR(Expect(':'));
  return true;
}

absl::Status JsonHeaderReader::BeginArray() {
  SkipWhitespace();
  RETURN_IF_ERROR(Expect('['));
  open_.push_back({']', true});
  return absl::OkStatus();
}

absl::StatusOr<bool> JsonHeaderReader::NextElement() { return NextEntry(']'); }

absl::StatusOr<std::string> JsonHeaderReader::ReadString() {
  SkipWhitespace();
  if (pos_ >= text_.size() || text_[pos_] != '"') {
    return Error("expected a string");
  }
  ++pos_;
  std::string out;
  while (true) {
    if (pos_ >= text_.size()) return Error("unterminated string");
    const unsigned char c = static_cast<unsigned char>(text_[pos_]);
    if (c == '"') {
      ++pos_;
      return out;
    }
    if (c < 0x20) return Error("unescaped control character in string");
    if (c == '\\') {
      if (pos_ + 1 >= text_.size()) return Error("unterminated string");
      const char e = text_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u':
          RETURN_IF_ERROR(ReadUnicodeEscape(&out));
          break;
        default:
          pos_ -= 2;
          return Error("invalid escape in string");
      }
      continue;
    }
    const size_t n = Utf8SequenceLength(text_, pos_);
    if (n == 0) return Error("invalid UTF-8 in string");
    out.append(text_.substr(pos_, n));
    pos_ += n;
  }
}

absl::StatusOr<uint32_t> JsonHeaderReader::ReadHex4() {
  if (text_.size() - pos_ < 4) return Error("truncated \\u escape");
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) {
    const char c = text_[pos_ + i];
    uint32_t d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return Error("invalid hex digit in \\u escape");
    }
    v = v * 16 + d;
  }
  pos_ += 4;
  return v;
}

absl::Status JsonHeaderReader::ReadUnicodeEscape(std::string* out) {
  ASSIGN_OR_RETURN(uint32_t cp, ReadHex4());
  if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("unpaired low surrogate");
  if (cp >= 0xD800 && cp <= 0xDBFF) {
    // Characters past U+FFFF are escaped as a UTF-16 surrogate pair.
    if (text_.substr(pos_, 2) != "\\u") return Error("unpaired high surrogate");
    pos_ += 2;
    ASSIGN_OR_RETURN(uint32_t low, ReadHex4());
    if (low < 0xDC00 || low > 0xDFFF) return Error("unpaired high surrogate");
    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
  }
  AppendUtf8(cp, out);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> JsonHeaderReader::ReadInteger() {
  SkipWhitespace();
  if (pos_ >= text_.size() || !IsDigit(text_[pos_])) {
    return Error("expected a non-negative integer");
  }
  if (text_[pos_] == '0' && pos_ + 1 < text_.size() &&
      IsDigit(text_[pos_ + 1])) {
    return Error("integer with a leading zero");
  }
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  uint64_t v = 0;
  while (pos_ < text_.size() && IsDigit(text_[pos_])) {
    const uint64_t d = text_[pos_] - '0';
    if (v > (kMax - d) / 10) return Error("integer too large");
    v = v * 10 + d;
    ++pos_;
  }
  if (pos_ < text_.size() &&
      (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E')) {
    return Error("expected an integer, found a fraction or exponent");
  }
  return v;
}

absl::Status JsonHeaderReader::Finish() {
  if (!open_.empty()) return Error("unclosed object or array");
  SkipWhitespace();
  if (pos_ != text_.size()) return Error("unexpected data after the value");
  return absl::OkStatus();
}

void JsonHeaderReader::SkipWhitespace() {
  while (pos_ < text_.size()) {
    const char c = text_[pos_];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    ++pos_;
  }
}

absl::Status JsonHeaderReader::Expect(char c) {
  if (pos_ >= text_.size() || text_[pos_] != c) {
    return Error(absl::StrCat("expected '", std::string(1, c), "'"));
  }
  ++pos_;
  return absl::OkStatus();
}

absl::Status JsonHeaderReader::Error(std::string_view what) const {
  if (pos_ >= text_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at end of header: ", AsAbsl(what)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("invalid JSON at byte ", pos_, ": ", AsAbsl(what)));
}

void AppendJsonString(std::string_view s, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xF]);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace gpipe::storage
