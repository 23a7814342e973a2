#include "services/pipeline/measured_cut.h"

#include <algorithm>
#include <utility>

namespace gpipe {
namespace {

// The lower median: a disturbed step is only ever slower.
double Median(std::vector<double> xs) {
  if (xs.empty()) return 0;
  const size_t mid = (xs.size() - 1) / 2;
  std::nth_element(xs.begin(), xs.begin() + mid, xs.end());
  return xs[mid];
}

}  // namespace

std::optional<StageCost> MeasuredStageCost(
    const std::vector<StepTimeline>& steps, int64_t micro_batches) {
  if (micro_batches < 1) return std::nullopt;
  std::vector<double> forward, backward, weight, update;
  for (const StepTimeline& s : steps) {
    const double f = s.busy_seconds(Phase::kForward);
    const double w = s.busy_seconds(Phase::kBackwardWeight);
    const double b = s.busy_seconds(Phase::kBackward) +
                     s.busy_seconds(Phase::kBackwardInput) + w +
                     s.busy_seconds(Phase::kRecompute);
    if (!(f > 0) || !(b > 0)) continue;
    forward.push_back(f);
    backward.push_back(b);
    weight.push_back(w);
    update.push_back(s.busy_seconds(Phase::kOptimizer));
  }
  if (forward.empty()) return std::nullopt;
  const double m = static_cast<double>(micro_batches);
  StageCost c;
  c.forward_seconds = Median(std::move(forward)) / m;
  c.backward_seconds = Median(std::move(backward)) / m;
  c.weight_seconds =
      std::min(c.backward_seconds, Median(std::move(weight)) / m);
  c.update_seconds = Median(std::move(update));
  return c;
}

std::vector<double> SimulatedBubbles(const std::vector<StageCost>& stages,
                                     ScheduleKind kind, int64_t m, int64_t v,
                                     std::vector<PhaseTicks> order_ticks) {
  if (stages.empty() || m < 1 || v < 1 ||
      stages.size() % static_cast<size_t>(v) != 0 ||
      !ScheduleShapeError(kind, static_cast<int64_t>(stages.size()) / v, m, v)
           .empty()) {
    return {};
  }
  SimulationConfig config;
  config.stages = stages;
  config.micro_batches = m;
  config.schedule = kind;
  config.virtual_stages = v;
  config.remat = RematMode::kNever;
  config.link_bytes_per_second = 1e18;
  if (kind == ScheduleKind::kZeroBubbleV)
    config.order_ticks = std::move(order_ticks);
  return WorkerBubbles(Simulate(config));
}

}  // namespace gpipe
