// Debian's Abseil (20220623) has its own string_view type, distinct from
// std::string_view; StrCat and Status messages take only the former.
#ifndef GPIPE_SERVICES_CORE_STRINGS_H_
#define GPIPE_SERVICES_CORE_STRINGS_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace gpipe {

inline absl::string_view AsAbsl(std::string_view v) {
  return absl::string_view(v.data(), v.size());
}

// Everything else passes through, so variadic helpers can wrap each argument.
template <typename T>
const T& AsAbsl(const T& v) {
  return v;
}

// At most `max_bytes` of `s`, cut back to a character boundary: a prefix of
// valid UTF-8 stays valid (a protobuf string field refuses anything else).
inline std::string_view Utf8Prefix(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut);
}

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_STRINGS_H_
