// gpipectl trace JOB: the stage timelines the controller keeps for a job, as
// Chrome trace JSON (Perfetto, chrome://tracing) and an SVG picture, or a
// per-stage summary on the terminal. Also the --steps parsing shared with
// train, submit and local, and `--trace DIR` of local.
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "cli/commands.h"
#include "cli/controller_client.h"
#include "cli/flag_checks.h"
#include "google/protobuf/util/json_util.h"
#include "services/pipeline/schedule.h"
#include "services/telemetry/step_trace.h"
#include "services/telemetry/trace_files.h"

ABSL_FLAG(std::vector<std::string>, o, {},
          "trace: write to FILE.json (Chrome trace) and/or FILE.svg "
          "(picture), comma-separated; a directory gets both as trace.json "
          "and timeline.svg. fetch: the directory to write into (default .)");
ABSL_DECLARE_FLAG(std::string, steps);
ABSL_DECLARE_FLAG(bool, json);

namespace gpipe::cli {
namespace {

namespace v1 = gpipe::v1;

constexpr char kUsage[] =
    "usage: gpipectl trace JOB [--steps A..B] [-o trace.json,timeline.svg | "
    "-o DIR]\n";

int Fail(const absl::Status& status) { return FailCommand("trace", status); }

absl::StatusOr<int64_t> ParseStep(absl::string_view text,
                                  const std::string& flag) {
  int64_t step = 0;
  if (!absl::SimpleAtoi(text, &step) || step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps: '", flag,
                     "' is not a step range: give A..B, A.., ..B or N "
                     "(0-based step numbers)"));
  }
  return step;
}

// "A..B", "A..", "..B" or "N" into the request's range.
absl::Status ParseStepRange(const std::string& flag,
                            v1::GetTraceRequest* request) {
  if (flag.empty()) return absl::OkStatus();
  const size_t dots = flag.find("..");
  if (dots == std::string::npos) {
    absl::StatusOr<int64_t> step = ParseStep(flag, flag);
    if (!step.ok()) return step.status();
    request->set_first_step(*step);
    request->set_last_step(*step);
    return absl::OkStatus();
  }
  const absl::string_view first = absl::string_view(flag).substr(0, dots);
  const absl::string_view last = absl::string_view(flag).substr(dots + 2);
  if (first.empty() && last.empty()) {
    return absl::InvalidArgumentError(
        "--steps: '..' names no step: give A..B, A.., ..B or N");
  }
  if (!first.empty()) {
    absl::StatusOr<int64_t> a = ParseStep(first, flag);
    if (!a.ok()) return a.status();
    request->set_first_step(*a);
  }
  if (!last.empty()) {
    absl::StatusOr<int64_t> b = ParseStep(last, flag);
    if (!b.ok()) return b.status();
    request->set_last_step(*b);
  }
  if (request->has_first_step() && request->has_last_step() &&
      request->first_step() > request->last_step()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--steps: ", flag, " ends before it begins (A must be <= B)"));
  }
  return absl::OkStatus();
}

// Per track (stage of a replica): steps, mean step time, busy share and mean
// time per phase.
void PrintSummary(const v1::GetTraceResponse& trace) {
  std::printf(
      "%s: K=%lld stages, M=%lld micro-batches, %s; steps %lld..%lld "
      "shown (the controller keeps %lld..%lld)\n",
      trace.job_id().c_str(), static_cast<long long>(trace.stages()),
      static_cast<long long>(trace.micro_batches()),
      std::string(ScheduleName(ScheduleFromSpec(trace.schedule()))).c_str(),
      static_cast<long long>(trace.steps(0).step()),
      static_cast<long long>(trace.steps(trace.steps_size() - 1).step()),
      static_cast<long long>(trace.first_stored_step()),
      static_cast<long long>(trace.last_stored_step()));
  // A split backward (zero-bubble) fills the input and weight columns, a
  // whole one the backward column.
  const auto tracks = ByTrack(trace);
  const bool replicas = HasReplicas(tracks);
  // The replica column only when there are replicas to tell apart.
  if (replicas) std::printf("%-7s ", "replica");
  std::printf("%-6s %6s %10s %7s %7s %10s %10s %10s %10s %10s %10s\n", "stage",
              "steps", "step ms", "busy", "bubble", "forward", "backward",
              "b.input", "b.weight", "recompute", "optimizer");
  for (const TraceTrack& track : tracks) {
    if (track.steps.empty()) continue;
    int64_t wall = 0, busy = 0;
    constexpr int kPhases = v1::OpTrace::Phase_MAX + 1;
    int64_t phase[kPhases] = {};
    for (const v1::StepTrace* s : track.steps) {
      wall += s->end_unix_ns() - s->start_unix_ns();
      for (const v1::OpTrace& op : s->ops()) {
        const int64_t d = op.end_unix_ns() - op.start_unix_ns();
        busy += d;
        if (op.phase() >= 0 && op.phase() < kPhases) phase[op.phase()] += d;
      }
    }
    const double n = static_cast<double>(track.steps.size());
    const double share = wall > 0 ? static_cast<double>(busy) / wall : 0;
    if (replicas) std::printf("%-7lld ", static_cast<long long>(track.replica));
    std::printf(
        "%-6lld %6zu %10.3f %6.1f%% %6.1f%% %10.3f %10.3f %10.3f %10.3f "
        "%10.3f %10.3f\n",
        static_cast<long long>(track.stage), track.steps.size(),
        wall * 1e-6 / n, 100 * share, 100 * (1 - share),
        phase[v1::OpTrace::FORWARD] * 1e-6 / n,
        phase[v1::OpTrace::BACKWARD] * 1e-6 / n,
        phase[v1::OpTrace::BACKWARD_INPUT] * 1e-6 / n,
        phase[v1::OpTrace::BACKWARD_WEIGHT] * 1e-6 / n,
        phase[v1::OpTrace::RECOMPUTE] * 1e-6 / n,
        phase[v1::OpTrace::OPTIMIZER] * 1e-6 / n);
  }
  std::printf(
      "(times are means per step in ms; -o FILE.json or FILE.svg "
      "writes the whole timeline)\n");
}

}  // namespace

absl::StatusOr<int64_t> StepCountFlag() {
  const std::string flag = absl::GetFlag(FLAGS_steps);
  if (flag.empty()) return 0;
  int64_t steps = 0;
  if (!absl::SimpleAtoi(flag, &steps) || steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--steps: '", flag, "' is not a number of training steps (1 or more)"));
  }
  return steps;
}

absl::Status WriteJobTraceDir(ControllerClient& client,
                              const std::string& job_id,
                              const std::string& dir) {
  v1::GetTraceRequest request;
  request.set_job_id(job_id);
  absl::StatusOr<v1::GetTraceResponse> all = client.GetTrace(request);
  if (!all.ok()) return all.status();
  // Only the last few: a picture of sixteen steps has boxes too thin to read.
  request.set_first_step(std::max<int64_t>(
      all->first_stored_step(), all->last_stored_step() - kTraceDirSteps + 1));
  absl::StatusOr<v1::GetTraceResponse> last = client.GetTrace(request);
  if (!last.ok()) return last.status();
  return WriteTraceDir(*last, dir);
}

int RunTrace(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr, "%s", kUsage);
    return 2;
  }
  v1::GetTraceRequest request;
  request.set_job_id(args[0]);
  if (absl::Status s = ParseStepRange(absl::GetFlag(FLAGS_steps), &request);
      !s.ok()) {
    std::fprintf(stderr, "gpipectl trace: %s\n%s",
                 std::string(s.message()).c_str(), kUsage);
    return 2;
  }
  std::vector<std::string> outputs;
  for (const std::string& path : absl::GetFlag(FLAGS_o)) {
    if (path.empty()) continue;
    std::error_code ec;
    const bool dir =
        absl::EndsWith(path, "/") || std::filesystem::is_directory(path, ec);
    if (!dir && !absl::EndsWithIgnoreCase(path, ".json") &&
        !absl::EndsWithIgnoreCase(path, ".svg")) {
      std::fprintf(stderr,
                   "gpipectl trace: -o %s: the format is chosen by the "
                   "extension: .json (Chrome trace, for Perfetto) or .svg "
                   "(timeline picture), or give a directory for both\n%s",
                   path.c_str(), kUsage);
      return 2;
    }
    outputs.push_back(path);
  }
  ControllerClient client = MakeControllerClient();
  absl::StatusOr<v1::GetTraceResponse> trace = client.GetTrace(request);
  if (!trace.ok()) return Fail(trace.status());
  if (trace->steps().empty()) {
    return Fail(absl::NotFoundError(
        absl::StrCat("the controller returned no steps for ", args[0])));
  }
  if (absl::GetFlag(FLAGS_json) && outputs.empty()) {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.add_whitespace = false;
    options.preserve_proto_field_names = false;
    (void)google::protobuf::util::MessageToJsonString(*trace, &json, options);
    std::printf("%s\n", json.c_str());
    return 0;
  }
  if (outputs.empty()) {
    PrintSummary(*trace);
    return 0;
  }
  for (const std::string& path : outputs) {
    std::error_code ec;
    const bool dir =
        absl::EndsWith(path, "/") || std::filesystem::is_directory(path, ec);
    absl::Status s =
        dir ? WriteTraceDir(*trace, path) : WriteTraceFile(*trace, path);
    if (!s.ok()) return Fail(s);
    if (dir) {
      std::printf("wrote %s\n", TraceDirFiles(path).c_str());
    } else {
      std::printf("wrote %s\n", path.c_str());
    }
  }
  std::printf(
      "%d stage-steps of %s (steps %lld..%lld)\n", trace->steps_size(),
      trace->job_id().c_str(), static_cast<long long>(trace->steps(0).step()),
      static_cast<long long>(trace->steps(trace->steps_size() - 1).step()));
  return 0;
}

}  // namespace gpipe::cli
