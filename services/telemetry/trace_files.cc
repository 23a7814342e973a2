#include "services/telemetry/trace_files.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/telemetry/chrome_trace.h"
#include "services/telemetry/timeline_svg.h"

namespace gpipe {

namespace {

absl::Status WriteAtomically(const std::string& path, const std::string& text) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out)
      return absl::UnavailableError(absl::StrCat("cannot create ", tmp));
    out << text;
    out.close();
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::UnavailableError(
        absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteTraceFile(const gpipe::v1::GetTraceResponse& trace,
                            const std::string& path) {
  if (absl::EndsWithIgnoreCase(path, ".json")) {
    return WriteAtomically(path, ChromeTraceJson(trace));
  }
  if (absl::EndsWithIgnoreCase(path, ".svg")) {
    return WriteAtomically(path, TimelineSvg(trace));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path,
                   ": the format is chosen by the extension: .json (Chrome "
                   "trace, for Perfetto) or .svg (timeline picture)"));
}

absl::Status WriteTraceDir(const gpipe::v1::GetTraceResponse& trace,
                           const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", dir, ": ", ec.message()));
  }
  RETURN_IF_ERROR(WriteTraceFile(trace, dir + "/trace.json"));
  return WriteTraceFile(trace, dir + "/timeline.svg");
}

}  // namespace gpipe
