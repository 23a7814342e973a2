#include "cli/stage_figures.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/simulator.h"

namespace gpipe::cli {

std::string BubbleTheoryText(ScheduleKind kind, int64_t k, int64_t m, int64_t v,
                             const std::vector<double>& cut) {
  if (k < 2 || m < 1 || v < 1) return "";
  std::string cut_text;
  if (static_cast<int64_t>(cut.size()) == k) {
    cut_text = absl::StrCat(
        ", this cut ", absl::StrJoin(cut, " ", [](std::string* out, double b) {
          absl::StrAppendFormat(out, "%.0f%%", 100 * std::clamp(b, 0.0, 1.0));
        }));
  }
  return absl::StrFormat(" (%s theory %.0f%%%s)", ScheduleName(kind),
                         100 * TheoreticalBubble(kind, k, m, v), cut_text);
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
