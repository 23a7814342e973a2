#include "services/telemetry/trace_files.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/storage/file_io.h"
#include "services/telemetry/chrome_trace.h"
#include "services/telemetry/timeline_svg.h"

namespace gpipe {
namespace {

// A file we cannot write is the caller's environment (a missing directory,
// a full disk): Unavailable, whatever the storage layer called it.
absl::Status WriteText(const std::string& path, const std::string& text) {
  absl::Status s = storage::WriteFileAtomically(path, text);
  return s.ok() ? s : absl::UnavailableError(s.message());
}

}  // namespace

absl::Status WriteTraceFile(const gpipe::v1::GetTraceResponse& trace,
                            const std::string& path) {
  if (absl::EndsWithIgnoreCase(path, ".json")) {
    return WriteText(path, ChromeTraceJson(trace));
  }
  if (absl::EndsWithIgnoreCase(path, ".svg")) {
    return WriteText(path, TimelineSvg(trace));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path,
                   ": the format is chosen by the extension: .json (Chrome "
                   "trace, for Perfetto) or .svg (timeline picture)"));
}

namespace {
std::string TraceFile(const std::string& dir) {
  return (std::filesystem::path(dir) / "trace.json").string();
}
std::string TimelineFile(const std::string& dir) {
  return (std::filesystem::path(dir) / "timeline.svg").string();
}
}  // namespace

absl::Status WriteTraceDir(const gpipe::v1::GetTraceResponse& trace,
                           const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", dir, ": ", ec.message()));
  }
  RETURN_IF_ERROR(WriteTraceFile(trace, TraceFile(dir)));
  return WriteTraceFile(trace, TimelineFile(dir));
}

std::string TraceDirFiles(const std::string& dir) {
  return absl::StrCat(TraceFile(dir), " and ", TimelineFile(dir));
}

}  // namespace gpipe
