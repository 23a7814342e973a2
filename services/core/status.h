// Status plumbing: early-return macros for absl::Status and absl::StatusOr.
#ifndef GPIPE_SERVICES_CORE_STATUS_H_
#define GPIPE_SERVICES_CORE_STATUS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"

namespace gpipe {

inline constexpr char kConsequencePayload[] = "gpipe.dev/consequence";

// An error that another part's failure caused, and says so (a stage told
// that its neighbour's evaluation failed): FirstCause ranks it after the
// part's own.
inline absl::Status MarkConsequence(absl::Status s) {
  s.SetPayload(kConsequencePayload, absl::Cord("1"));
  return s;
}
inline bool IsConsequence(const absl::Status& s) {
  return s.GetPayload(kConsequencePayload).has_value();
}

// Of parts that ran together, the error that caused the others' (which
// fail CANCELLED once the first failure closes what they wait on, or with
// an error marked as a consequence): the first that is neither, else the
// first that is not CANCELLED, else the first. OK when every part is.
inline absl::Status FirstCause(const std::vector<absl::Status>& parts) {
  const auto rank = [](const absl::Status& s) {
    return absl::IsCancelled(s) ? 2 : IsConsequence(s) ? 1 : 0;
  };
  absl::Status first = absl::OkStatus();
  for (const absl::Status& s : parts) {
    if (s.ok()) continue;
    if (first.ok() || rank(s) < rank(first)) first = s;
  }
  return first;
}

}  // namespace gpipe

#define GPIPE_CONCAT_INNER(a, b) a##b
#define GPIPE_CONCAT(a, b) GPIPE_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status _gpipe_status = (expr);         \
    if (!_gpipe_status.ok()) return _gpipe_status; \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(*tmp)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(GPIPE_CONCAT(_gpipe_statusor_, __LINE__), lhs, expr)

#endif  // GPIPE_SERVICES_CORE_STATUS_H_
