#include "services/core/log.h"

#include <cstdio>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gpipe {

void LogLine(LogLevel level, std::string_view message) {
  const char tag = level == LogLevel::kInfo      ? 'I'
                   : level == LogLevel::kWarning ? 'W'
                                                 : 'E';
  const std::string when =
      absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone());
  std::fprintf(stderr, "%c %s %.*s\n", tag, when.c_str(),
               static_cast<int>(message.size()), message.data());
}

}  // namespace gpipe
