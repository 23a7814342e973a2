// Writes a trace to files, the format chosen by the file's extension:
// ".json" the Chrome trace event format, ".svg" the timeline picture.
#ifndef GPIPE_SERVICES_TELEMETRY_TRACE_FILES_H_
#define GPIPE_SERVICES_TELEMETRY_TRACE_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "gpipe/v1/controller.pb.h"

namespace gpipe {

// InvalidArgument for another extension; Unavailable when the file cannot
// be written. Written to a temporary name and renamed, so a reader never
// sees half a file.
absl::Status WriteTraceFile(const gpipe::v1::GetTraceResponse& trace,
                            const std::string& path);

// DIR/trace.json and DIR/timeline.svg (DIR created when missing).
absl::Status WriteTraceDir(const gpipe::v1::GetTraceResponse& trace,
                           const std::string& dir);
// "DIR/trace.json and DIR/timeline.svg", the files WriteTraceDir writes,
// joined as paths ("t3/" gave "t3//trace.json").
std::string TraceDirFiles(const std::string& dir);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_TRACE_FILES_H_
