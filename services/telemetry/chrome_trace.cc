#include "services/telemetry/chrome_trace.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/telemetry/step_trace.h"

namespace gpipe {

namespace v1 = gpipe::v1;

namespace {

// The job is one process; its tracks (stages of each replica, by replica
// then stage) are its threads.
constexpr int kPid = 1;

std::string Micros(int64_t ns, int64_t origin_ns) {
  return absl::StrFormat("%.3f", (ns - origin_ns) * 1e-3);
}

std::string SliceName(const v1::OpTrace& op) {
  switch (op.phase()) {
    case v1::OpTrace::FORWARD:
      return absl::StrCat("F", op.micro_batch());
    case v1::OpTrace::BACKWARD:
      return absl::StrCat("B", op.micro_batch());
    case v1::OpTrace::RECOMPUTE:
      return absl::StrCat("R", op.micro_batch());
    case v1::OpTrace::BACKWARD_INPUT:
      return absl::StrCat("B", op.micro_batch(), " input");
    case v1::OpTrace::BACKWARD_WEIGHT:
      return absl::StrCat("W", op.micro_batch());
    case v1::OpTrace::OPTIMIZER:
      return "optimizer";
    default:
      return absl::StrCat("op ", op.micro_batch());
  }
}

}  // namespace

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;  // UTF-8 passes through as it is
        }
    }
  }
  out += '"';
  return out;
}

std::string ChromeTraceJson(const v1::GetTraceResponse& trace) {
  const TimeSpan span = Span(trace);
  const std::vector<TraceTrack> tracks = ByTrack(trace);
  const bool replicas = HasReplicas(tracks);
  std::vector<std::string> events;
  events.push_back(absl::StrCat(
      R"({"name":"process_name","ph":"M","pid":)", kPid, R"(,"args":{"name":)",
      JsonString(absl::StrCat(
          "gpipe ", trace.job_id(), " (K=", trace.stages(),
          trace.replicas() > 1 ? absl::StrCat(", R=", trace.replicas()) : "",
          ", M=", trace.micro_batches(), ", ",
          v1::Schedule_Name(trace.schedule()), ")")),
      "}}"));
  for (size_t tid = 0; tid < tracks.size(); ++tid) {
    const TraceTrack& track = tracks[tid];
    events.push_back(absl::StrCat(
        R"({"name":"thread_name","ph":"M","pid":)", kPid, R"(,"tid":)", tid,
        R"(,"args":{"name":)", JsonString(TrackName(track, replicas)), "}}"));
    events.push_back(absl::StrCat(
        R"({"name":"thread_sort_index","ph":"M","pid":)", kPid, R"(,"tid":)",
        tid, R"(,"args":{"sort_index":)", tid, "}}"));
    for (const v1::StepTrace* step : track.steps) {
      events.push_back(absl::StrCat(
          R"({"name":)", JsonString(absl::StrCat("step ", step->step())),
          R"(,"cat":"step","ph":"X","pid":)", kPid, R"(,"tid":)", tid,
          R"(,"ts":)", Micros(step->start_unix_ns(), span.begin_ns),
          R"(,"dur":)", Micros(step->end_unix_ns(), step->start_unix_ns()),
          R"(,"args":{"step":)", step->step(), R"(,"epoch":)", step->epoch(),
          R"(,"stage":)", track.stage, R"(,"replica":)", track.replica,
          R"(,"worker":)", JsonString(step->worker_id()), "}}"));
      for (const v1::OpTrace& op : step->ops()) {
        events.push_back(absl::StrCat(
            R"({"name":)", JsonString(SliceName(op)), R"(,"cat":)",
            JsonString(PhaseName(op.phase())), R"(,"ph":"X","pid":)", kPid,
            R"(,"tid":)", tid, R"(,"ts":)",
            Micros(op.start_unix_ns(), span.begin_ns), R"(,"dur":)",
            Micros(op.end_unix_ns(), op.start_unix_ns()), R"(,"args":{"step":)",
            step->step(), R"(,"micro_batch":)", op.micro_batch(),
            R"(,"bytes_sent":)", op.bytes_sent(), R"(,"bytes_received":)",
            op.bytes_received(), "}}"));
      }
    }
  }
  std::string out = "{\"traceEvents\":[\n";
  for (size_t i = 0; i < events.size(); ++i) {
    absl::StrAppend(&out, events[i], i + 1 < events.size() ? ",\n" : "\n");
  }
  absl::StrAppend(
      &out, "],\"displayTimeUnit\":\"ms\",\"otherData\":{",
      "\"job\":", JsonString(trace.job_id()), ",\"stages\":", trace.stages(),
      ",\"micro_batches\":", trace.micro_batches(),
      ",\"replicas\":", std::max<int64_t>(1, trace.replicas()),
      ",\"schedule\":", JsonString(v1::Schedule_Name(trace.schedule())),
      ",\"start_unix_ns\":", span.begin_ns, "}}\n");
  return out;
}

}  // namespace gpipe
