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

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_STRINGS_H_
