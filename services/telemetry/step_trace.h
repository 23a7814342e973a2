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

// Appends every step `timeline` still keeps as records of `stage`.
void AppendTimeline(const Timeline& timeline, int64_t stage,
                    gpipe::v1::GetTraceResponse* trace);

gpipe::v1::OpTrace::Phase ToProtoPhase(Phase phase);
// "forward", "backward", "recompute", "optimizer" ("unknown" otherwise).
const char* PhaseName(gpipe::v1::OpTrace::Phase phase);

// The steps of a trace grouped by stage (index = stage), each stage's steps
// in step order; records of a stage outside [0, stages) are dropped.
std::vector<std::vector<const gpipe::v1::StepTrace*>> ByStage(
    const gpipe::v1::GetTraceResponse& trace);

// Earliest start and latest end over every record (0, 0 when empty).
struct TimeSpan {
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
};
TimeSpan Span(const gpipe::v1::GetTraceResponse& trace);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_STEP_TRACE_H_
