// The figures a stage's step contributes to its metrics, computed from the
// stage timeline: busy time per phase, bubble (the step's wall time on the
// stage minus busy), and their shares of the wall time. Pure functions, so
// the metric arithmetic is testable without a registry.
#ifndef GPIPE_SERVICES_TELEMETRY_STEP_FIGURES_H_
#define GPIPE_SERVICES_TELEMETRY_STEP_FIGURES_H_

#include <array>
#include <cstdint>

#include "services/pipeline/schedule.h"
#include "services/pipeline/timeline.h"

namespace gpipe {

// forward, backward, recompute, optimizer, backward_input, backward_weight
inline constexpr int kPhaseCount = 6;

struct StepFigures {
  double wall_seconds = 0;
  std::array<double, kPhaseCount> busy_by_phase{};  // indexed by Phase
  double busy_seconds = 0;
  double bubble_seconds = 0;     // never negative
  double utilization_ratio = 0;  // busy / wall, in [0, 1]
  double bubble_ratio = 0;       // bubble / wall = 1 - utilization
};

StepFigures ComputeStepFigures(const StepTimeline& step);

// The idle share of a stage in one step of a balanced pipeline with K stages
// and M micro-batches under `schedule` (TheoreticalBubble in simulator.h):
// (K-1)/(M+K-1) for GPipe and 1F1B alike (1F1B saves memory, not bubble),
// (K-1)/(3M+K-1) for ZB-H1 when M >= K. 0 for K <= 1 or M <= 0.
double TheoreticalBubbleRatio(int64_t stages, int64_t micro_batches,
                              ScheduleKind schedule = ScheduleKind::kGPipe,
                              int64_t virtual_stages = 1);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_STEP_FIGURES_H_
