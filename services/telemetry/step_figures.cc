#include "services/telemetry/step_figures.h"

#include <algorithm>

#include "services/pipeline/simulator.h"

namespace gpipe {

StepFigures ComputeStepFigures(const StepTimeline& step) {
  StepFigures f;
  f.wall_seconds = std::max(0.0, step.wall_seconds());
  for (const OpRecord& op : step.ops) {
    const double seconds = (op.end_ns - op.start_ns) * 1e-9;
    f.busy_by_phase[static_cast<int>(op.phase)] += seconds;
    f.busy_seconds += seconds;
  }
  // Ops are recorded inside the step, so busy <= wall up to clock reads;
  // clamp so a ratio never leaves [0, 1].
  f.bubble_seconds = std::max(0.0, f.wall_seconds - f.busy_seconds);
  if (f.wall_seconds > 0) {
    f.utilization_ratio = std::min(1.0, f.busy_seconds / f.wall_seconds);
    f.bubble_ratio = f.bubble_seconds / f.wall_seconds;
  }
  return f;
}

double TheoreticalBubbleRatio(int64_t stages, int64_t micro_batches,
                              ScheduleKind schedule, int64_t virtual_stages) {
  return TheoreticalBubble(schedule, stages, micro_batches, virtual_stages);
}

}  // namespace gpipe
