#include "cli/stage_figures.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "services/pipeline/simulator.h"

namespace gpipe::cli {

std::string BubbleTheoryText(ScheduleKind kind, int64_t k, int64_t m,
                             int64_t v) {
  if (k < 2 || m < 1 || v < 1) return "";
  return absl::StrFormat(" (%s theory %.0f%%)", ScheduleName(kind),
                         100 * TheoreticalBubble(kind, k, m, v));
}

std::string StageFiguresLine(const std::vector<WorkerFigures>& workers,
                             const std::string& theory) {
  if (workers.empty()) return "";
  const auto percents = [&workers](double WorkerFigures::*share) {
    return absl::StrJoin(
        workers, " ", [share](std::string* out, const WorkerFigures& w) {
          absl::StrAppendFormat(out, "%.0f%%",
                                100 * std::clamp(w.*share, 0.0, 1.0));
        });
  };
  return absl::StrCat("util ", percents(&WorkerFigures::utilization),
                      "  bubble ", percents(&WorkerFigures::bubble), theory);
}

}  // namespace gpipe::cli
