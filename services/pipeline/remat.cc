#include "services/pipeline/remat.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpipe {

std::string_view RematName(RematMode mode) {
  switch (mode) {
    case RematMode::kAlways:
      return "always";
    case RematMode::kExceptLast:
      return "except_last";
    case RematMode::kNever:
      return "never";
  }
  return "?";
}

absl::StatusOr<RematMode> ParseRematName(std::string_view name) {
  if (name == "always") return RematMode::kAlways;
  if (name == "except_last" || name == "except-last")
    return RematMode::kExceptLast;
  if (name == "never") return RematMode::kNever;
  return absl::InvalidArgumentError(
      absl::StrCat("remat: '", std::string(name),
                   "' is not one of always, except_last, never"));
}

RematMode RematFromSpec(gpipe::v1::Remat remat) {
  switch (remat) {
    case gpipe::v1::ALWAYS:
      return RematMode::kAlways;
    case gpipe::v1::NEVER:
      return RematMode::kNever;
    default:
      return RematMode::kExceptLast;
  }
}

gpipe::v1::Remat RematToSpec(RematMode mode) {
  switch (mode) {
    case RematMode::kAlways:
      return gpipe::v1::ALWAYS;
    case RematMode::kExceptLast:
      return gpipe::v1::EXCEPT_LAST;
    case RematMode::kNever:
      return gpipe::v1::NEVER;
  }
  return gpipe::v1::EXCEPT_LAST;
}

}  // namespace gpipe
