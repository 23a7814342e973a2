#include "cli/stage_figures.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  std::string util, bubble;
  for (const WorkerFigures& w : workers) {
    absl::StrAppend(
        &util, util.empty() ? "" : " ",
        absl::StrFormat("%.0f%%", 100 * std::clamp(w.utilization, 0.0, 1.0)));
    absl::StrAppend(
        &bubble, bubble.empty() ? "" : " ",
        absl::StrFormat("%.0f%%", 100 * std::clamp(w.bubble, 0.0, 1.0)));
  }
  return absl::StrCat("util ", util, "  bubble ", bubble, theory);
}

}  // namespace gpipe::cli
