// A strict pull reader and a string writer for the small JSON subset a
// safetensors header uses: objects, arrays, strings and non-negative integers.
// The header parser drives the reader by the schema it expects instead of
// building a tree, so a hostile 100 MB header costs memory in proportion to
// what it declares, and nesting depth is fixed by the caller, not the input.
#ifndef GPIPE_SERVICES_STORAGE_JSON_HEADER_H_
#define GPIPE_SERVICES_STORAGE_JSON_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gpipe::storage {

// Reads one JSON value from `text`, one token at a time. Every error is
// InvalidArgument and gives the byte offset. Anything outside the subset
// (true, false, null, negative or fractional numbers) is an error too.
class JsonHeaderReader {
 public:
  enum class Token { kObject, kArray, kString, kInteger, kOther, kEnd };

  explicit JsonHeaderReader(std::string_view text) : text_(text) {}

  // What the next value is, judged by its first byte; consumes only
  // whitespace.
  Token Peek();

  // Consumes '{'. Then call NextMember until it returns false.
  absl::Status BeginObject();
  // Consumes the separator and either the closing '}' (returns false) or the
  // next member's key and its ':' (returns true, the value comes next).
  absl::StatusOr<bool> NextMember(std::string* key);

  // Consumes '['. Then call NextElement until it returns false.
  absl::Status BeginArray();
  // Consumes the separator and either the closing ']' (returns false) or
  // nothing more (returns true, the element comes next).
  absl::StatusOr<bool> NextElement();

  absl::StatusOr<std::string> ReadString();
  absl::StatusOr<uint64_t> ReadInteger();

  // Succeeds when only whitespace is left (safetensors pads with spaces).
  absl::Status Finish();

  size_t offset() const { return pos_; }

 private:
  void SkipWhitespace();
  absl::Status Expect(char c);
  absl::Status Error(std::string_view what) const;
  // Appends the character of a \uXXXX escape (after the "\u"), reading a
  // second escape when the first is a high surrogate.
  absl::Status ReadUnicodeEscape(std::string* out);
  absl::StatusOr<uint32_t> ReadHex4();
  // The next entry of the innermost container closed by `close`.
  absl::StatusOr<bool> NextEntry(char close);

  std::string_view text_;
  size_t pos_ = 0;

  struct Open {
    char close;  // '}' or ']'
    bool first;  // no member or element read yet
  };
  std::vector<Open> open_;
};

// Appends `s` as a quoted JSON string. `s` must be valid UTF-8.
void AppendJsonString(std::string_view s, std::string* out);

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or values
// past U+10FFFF), as RFC 8259 requires of JSON text.
bool IsValidUtf8(std::string_view s);

}  // namespace gpipe::storage

#endif  // GPIPE_SERVICES_STORAGE_JSON_HEADER_H_
