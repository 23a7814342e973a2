#include "services/telemetry/step_trace.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gpipe {

namespace v1 = gpipe::v1;

namespace {
constexpr int64_t kMaxStages = 4096;
}  // namespace

int64_t UnixNsAtOrigin(const Timeline& timeline) {
  const int64_t since_origin = timeline.Now();
  const int64_t unix_now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count();
  return unix_now - since_origin;
}

v1::OpTrace::Phase ToProtoPhase(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return v1::OpTrace::FORWARD;
    case Phase::kBackward:
      return v1::OpTrace::BACKWARD;
    case Phase::kRecompute:
      return v1::OpTrace::RECOMPUTE;
    case Phase::kOptimizer:
      return v1::OpTrace::OPTIMIZER;
    case Phase::kBackwardInput:
      return v1::OpTrace::BACKWARD_INPUT;
    case Phase::kBackwardWeight:
      return v1::OpTrace::BACKWARD_WEIGHT;
  }
  return v1::OpTrace::PHASE_UNSPECIFIED;
}

const char* PhaseName(v1::OpTrace::Phase phase) {
  switch (phase) {
    case v1::OpTrace::FORWARD:
      return "forward";
    case v1::OpTrace::BACKWARD:
      return "backward";
    case v1::OpTrace::RECOMPUTE:
      return "recompute";
    case v1::OpTrace::OPTIMIZER:
      return "optimizer";
    case v1::OpTrace::BACKWARD_INPUT:
      return "backward_input";
    case v1::OpTrace::BACKWARD_WEIGHT:
      return "backward_weight";
    default:
      return "unknown";
  }
}

v1::StepTrace ToStepTrace(const StepTimeline& step, int64_t stage,
                          int64_t origin_unix_ns) {
  v1::StepTrace t;
  t.set_stage(stage);
  t.set_step(step.step);
  t.set_start_unix_ns(origin_unix_ns + step.start_ns);
  t.set_end_unix_ns(origin_unix_ns + step.end_ns);
  t.mutable_ops()->Reserve(static_cast<int>(step.ops.size()));
  for (const OpRecord& op : step.ops) {
    v1::OpTrace* o = t.add_ops();
    o->set_phase(ToProtoPhase(op.phase));
    o->set_micro_batch(op.micro_batch);
    o->set_start_unix_ns(origin_unix_ns + op.start_ns);
    o->set_end_unix_ns(origin_unix_ns + op.end_ns);
    o->set_bytes_sent(op.bytes_sent);
    o->set_bytes_received(op.bytes_received);
  }
  return t;
}

void AppendTimeline(const Timeline& timeline, int64_t stage,
                    v1::GetTraceResponse* trace, int64_t replica) {
  const int64_t origin = UnixNsAtOrigin(timeline);
  for (const StepTimeline& step : timeline.Steps()) {
    v1::StepTrace* t = trace->add_steps();
    *t = ToStepTrace(step, stage, origin);
    t->set_replica(replica);
  }
}

std::vector<TraceTrack> ByTrack(const v1::GetTraceResponse& trace) {
  // Without a stage count, as many as the records name, within reason.
  int64_t stages = trace.stages();
  if (stages <= 0) {
    for (const v1::StepTrace& s : trace.steps())
      stages = std::max(stages, s.stage() + 1);
    stages = std::min<int64_t>(stages, kMaxStages);
  }
  std::map<std::pair<int64_t, int64_t>, TraceTrack> tracks;
  for (int64_t stage = 0; stage < stages; ++stage) {
    tracks[{0, stage}] = TraceTrack{0, stage, {}};
  }
  for (const v1::StepTrace& s : trace.steps()) {
    if (s.stage() < 0 || s.stage() >= stages || s.replica() < 0) continue;
    TraceTrack& t = tracks[{s.replica(), s.stage()}];
    t.replica = s.replica();
    t.stage = s.stage();
    t.steps.push_back(&s);
  }
  std::vector<TraceTrack> out;
  out.reserve(tracks.size());
  for (auto& [key, t] : tracks) {
    std::stable_sort(t.steps.begin(), t.steps.end(),
                     [](const v1::StepTrace* a, const v1::StepTrace* b) {
                       return a->step() < b->step();
                     });
    out.push_back(std::move(t));
  }
  return out;
}

bool HasReplicas(const std::vector<TraceTrack>& tracks) {
  return std::any_of(tracks.begin(), tracks.end(),
                     [](const TraceTrack& t) { return t.replica != 0; });
}

std::string TrackName(const TraceTrack& track, bool replicas) {
  return replicas
             ? absl::StrCat("replica ", track.replica, " stage ", track.stage)
             : absl::StrCat("stage ", track.stage);
}

TimeSpan Span(const v1::GetTraceResponse& trace) {
  TimeSpan span;
  int64_t begin = std::numeric_limits<int64_t>::max();
  int64_t end = std::numeric_limits<int64_t>::min();
  for (const v1::StepTrace& s : trace.steps()) {
    begin = std::min(begin, s.start_unix_ns());
    end = std::max(end, s.end_unix_ns());
    for (const v1::OpTrace& op : s.ops()) {
      begin = std::min(begin, op.start_unix_ns());
      end = std::max(end, op.end_unix_ns());
    }
  }
  if (begin <= end) span = {begin, end};
  return span;
}

}  // namespace gpipe
