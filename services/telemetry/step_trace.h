// Stage timelines as wire records: one gpipe.v1.StepTrace per stage and
// step, op times on the wall clock (Unix ns). Workers send these to the
// controller; `gpipectl train` builds the same from its in-process stages, so
// one pair of exporters draws both.
//
// A Timeline counts on the steady clock from its own origin. Sampling the
// system clock and the timeline's clock back to back gives the wall-clock
// time of the origin; steady and system clocks advance at the same rate over
// a step, so that one sample maps the step's records with sub-microsecond
// error. Stages of one process share one system clock and line up exactly;
// across hosts the records are as close as the hosts' clocks (NTP: about a
// millisecond on a LAN). Nothing here corrects skew between hosts: the
// controller logs when a record ends after it arrived (a clock that runs
// ahead), which bounds it from one side.
#ifndef GPIPE_SERVICES_TELEMETRY_STEP_TRACE_H_
#define GPIPE_SERVICES_TELEMETRY_STEP_TRACE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gpipe/v1/controller.pb.h"
#include "services/pipeline/timeline.h"

namespace gpipe {

// Unix ns of `timeline`'s origin, from one sample of both clocks.
int64_t UnixNsAtOrigin(const Timeline& timeline);

// One step of one stage as a wire record; `origin_unix_ns` from
// UnixNsAtOrigin.
gpipe::v1::StepTrace ToStepTrace(const StepTimeline& step, int64_t stage,
                                 int64_t origin_unix_ns);

// Appends every step `timeline` still keeps as records of `stage` of
// `replica`.
void AppendTimeline(const Timeline& timeline, int64_t stage,
                    gpipe::v1::GetTraceResponse* trace, int64_t replica = 0);

gpipe::v1::OpTrace::Phase ToProtoPhase(Phase phase);
// "forward", "backward", "recompute", "optimizer" ("unknown" otherwise).
const char* PhaseName(gpipe::v1::OpTrace::Phase phase);

// One row of a timeline: one stage of one replica, its steps in step order.
struct TraceTrack {
  int64_t replica = 0;
  int64_t stage = 0;
  std::vector<const gpipe::v1::StepTrace*> steps;
};

// The steps of a trace as tracks ordered by (replica, stage): every stage of
// replica 0 (a stage with no records too), then the stages of other replicas
// that have records. Records of a stage outside [0, stages) or of a negative
// replica are dropped.
std::vector<TraceTrack> ByTrack(const gpipe::v1::GetTraceResponse& trace);

// "stage 2", or "replica 1 stage 2" when `tracks` hold more than one replica.
std::string TrackName(const TraceTrack& track, bool replicas);
// Whether `tracks` hold records of a replica other than 0.
bool HasReplicas(const std::vector<TraceTrack>& tracks);

// Earliest start and latest end over every record (0, 0 when empty).
struct TimeSpan {
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};
TimeSpan Span(const gpipe::v1::GetTraceResponse& trace);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_STEP_TRACE_H_
