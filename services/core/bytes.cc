#include "services/core/bytes.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gpipe {

absl::StatusOr<int64_t> ParseBytes(absl::string_view text,
                                   absl::string_view what) {
  struct Unit {
    absl::string_view suffix;
    double factor;
  };
  constexpr double kKi = 1024.0;
  static constexpr Unit kUnits[] = {{"KiB", kKi},
                                    {"MiB", kKi * kKi},
                                    {"GiB", kKi * kKi * kKi},
                                    {"TiB", kKi * kKi * kKi * kKi},
                                    {"KB", 1e3},
                                    {"MB", 1e6},
                                    {"GB", 1e9},
                                    {"TB", 1e12},
                                    {"B", 1}};
  double factor = 1;
  absl::string_view number = text;
  for (const Unit& u : kUnits) {
    if (absl::EndsWith(text, u.suffix)) {
      factor = u.factor;
      number = text.substr(0, text.size() - u.suffix.size());
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !(value >= 0) ||
      value * factor > 9e18) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": expected bytes such as 0, 1048576, 512MiB or 2GiB, "
                     "got '",
                     text, "'"));
  }
  return static_cast<int64_t>(value * factor);
}

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B",   "KiB", "MiB", "GiB",
                                           "TiB", "PiB", "EiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 6) {
    value /= 1024;
    ++unit;
  }
  const char* unit_name = kUnits[unit];
  if (value >= 100) return absl::StrFormat("%.0f %s", value, unit_name);
  if (value >= 10) return absl::StrFormat("%.1f %s", value, unit_name);
  return absl::StrFormat("%.2f %s", value, unit_name);
}

}  // namespace gpipe
