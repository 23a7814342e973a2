// Status plumbing: early-return macros for absl::Status and absl::StatusOr.
#ifndef GPIPE_SERVICES_CORE_STATUS_H_
#define GPIPE_SERVICES_CORE_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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
