// Minimal leveled logging to stderr with a timestamp; one line per call.
#ifndef GPIPE_SERVICES_CORE_LOG_H_
#define GPIPE_SERVICES_CORE_LOG_H_

#include <string_view>

#include "absl/strings/str_format.h"

namespace gpipe {

enum class LogLevel { kInfo, kWarning, kError };

void LogLine(LogLevel level, std::string_view message);

template <typename... Args>
void LogInfo(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogLevel::kInfo, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogWarning(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogLevel::kWarning, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogLevel::kError, absl::StrFormat(format, args...));
}

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_LOG_H_
