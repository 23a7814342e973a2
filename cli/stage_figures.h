// The stage figures after gpipectl's progress bar, for a cluster's job
// (client_commands.cc) and the in-process pipeline (train_command.cc) alike:
// "util 83% 96%  bubble 17% 4% (zb-h1 theory 4%)".
#ifndef GPIPE_CLI_STAGE_FIGURES_H_
#define GPIPE_CLI_STAGE_FIGURES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gpipe/v1/job.pb.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"

namespace gpipe::cli {

// A worker's share of its step busy, and idle; stage 0's worker first.
struct WorkerFigures {
  double utilization = 0;
  double bubble = 0;
};

// " (zb-h1 theory 4%, this cut 16% 6%)": the bubble `kind` has in theory on
// K equal workers of v chunks each with M micro-batches (TheoreticalBubble)
// and, when given, each worker's for the cut it runs (from the stages'
// measured times, SimulatedBubbles, or the cost model's, CutBubbles): what
// the measured bubbles are read against. Empty for fewer than two workers.
std::string BubbleTheoryText(ScheduleKind kind, int64_t k, int64_t m, int64_t v,
                             const std::vector<double>& cut = {});

// "util 83% 96%  bubble 17% 4%" followed by `theory`; empty without workers.
std::string StageFiguresLine(const std::vector<WorkerFigures>& workers,
                             const std::string& theory);

}  // namespace gpipe::cli

#endif  // GPIPE_CLI_STAGE_FIGURES_H_
