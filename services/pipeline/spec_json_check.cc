#include "services/pipeline/spec_json_check.h"

#include <cctype>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/storage/safetensors_header.h"

namespace gpipe {
namespace {

struct Position {
  int64_t line = 1;
  int64_t column = 0;
};

// A JobSpec has no map fields, so every object key is a field name, and
// protobuf takes a field by its proto name or its JSON (lowerCamel) name.
std::string FieldKey(std::string_view raw) {
  std::string key;
  key.reserve(raw.size());
  bool upper_next = false;
  for (const char c : raw) {
    if (c == '_') {
      upper_next = true;
      continue;
    }
    key.push_back(upper_next ? static_cast<char>(
                                   std::toupper(static_cast<unsigned char>(c)))
                             : c);
    upper_next = false;
  }
  return key;
}

struct Frame {
  char kind = '[';  // '[' or '{'
  bool expect_key = false;
  std::map<std::string, Position> keys;  // objects only
};

}  // namespace

absl::Status CheckSpecJsonStructure(std::string_view json) {
  std::vector<Frame> open;
  Position at;
  bool in_string = false, escaped = false;
  bool string_is_key = false;
  size_t string_start = 0;
  Position string_at;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    ++at.column;
    if (c == '\n') at.line += 1, at.column = 0;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
        if (string_is_key) {
          const std::string_view raw =
              json.substr(string_start, i - string_start);
          const auto [it, inserted] =
              open.back().keys.emplace(FieldKey(raw), string_at);
          if (!inserted) {
            return absl::InvalidArgumentError(absl::StrCat(
                "job spec: line ", string_at.line, ", column ",
                string_at.column, ": ", storage::QuoteForMessage(raw),
                " is given a second time in this object (first at line ",
                it->second.line, ", column ", it->second.column,
                "); only one value can be taken, so remove the other"));
          }
        }
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      string_is_key =
          !open.empty() && open.back().kind == '{' && open.back().expect_key;
      if (string_is_key) open.back().expect_key = false;
      string_start = i + 1;
      string_at = at;
    } else if (c == '[' || c == '{') {
      Frame frame;
      frame.kind = c;
      frame.expect_key = c == '{';
      open.push_back(std::move(frame));
    } else if ((c == ']' || c == '}') && !open.empty()) {
      open.pop_back();
    } else if (c == ',' && !open.empty() && open.back().kind == '{') {
      open.back().expect_key = true;
    } else if (c == 'n' && json.substr(i, 4) == "null" && !open.empty() &&
               open.back().kind == '[') {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec: line ", at.line, ", column ", at.column,
          ": null is not a list entry (a layer or value left empty?)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace gpipe
