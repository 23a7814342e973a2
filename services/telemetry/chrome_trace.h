// A trace in the Chrome trace event format (JSON), which Perfetto and
// chrome://tracing open: one process for the job, one thread (track) per
// stage named "stage i" ("replica r stage i" when the job runs replicas),
// each op as a complete ("X") slice named F3, B3, R3 (forward, backward,
// recompute of micro-batch 3) or "optimizer", nested in one "step s" slice
// per track and step. Bubbles are the gaps between op
// slices. Times are microseconds from the earliest record.
#ifndef GPIPE_SERVICES_TELEMETRY_CHROME_TRACE_H_
#define GPIPE_SERVICES_TELEMETRY_CHROME_TRACE_H_

#include <string>
#include <string_view>

#include "gpipe/v1/controller.pb.h"

namespace gpipe {

std::string ChromeTraceJson(const gpipe::v1::GetTraceResponse& trace);

// `text` as a JSON string literal, quotes included.
std::string JsonString(std::string_view text);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_CHROME_TRACE_H_
