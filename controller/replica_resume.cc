#include "controller/replica_resume.h"

#include <algorithm>
#include <set>

#include "services/pipeline/job_spec.h"
#include "services/pipeline/schedule.h"

namespace gpipe::controller {

std::optional<MemoryResume> PlanMemoryResume(
    const std::vector<std::pair<int64_t, int64_t>>& cut,
    const std::map<std::string, gpipe::v1::StageParked>& parked,
    const std::function<bool(const std::string&)>& available) {
  if (cut.empty()) return std::nullopt;
  // The totals of squared gradients the reports tell, by step.
  std::map<int64_t, double> totals;
  for (const auto& [id, p] : parked) {
    if (p.last_update_step() >= 0)
      totals[p.last_update_step()] = p.last_update_squares();
  }
  std::set<int64_t, std::greater<>> steps;
  for (const auto& [id, p] : parked) {
    if (p.step() < 0) continue;  // it kept nothing
    steps.insert(p.step());
    if (p.pending_update() && totals.count(p.step()))
      steps.insert(p.step() + 1);
  }
  for (int64_t step : steps) {
    MemoryResume plan;
    plan.step = step;
    plan.cut = cut;
    for (const auto& [begin, end] : cut) {
      // Rank: holding it outright first, then by replica.
      const std::string* best = nullptr;
      std::pair<bool, int64_t> best_rank;
      for (const auto& [id, p] : parked) {
        if (p.layer_begin() != begin || p.layer_end() != end ||
            !available(id)) {
          continue;
        }
        const bool outright = p.step() == step;
        const bool rolls = p.pending_update() && p.step() + 1 == step &&
                           totals.count(p.step()) > 0;
        if (!outright && !rolls) continue;
        const std::pair<bool, int64_t> rank = {!outright, p.replica()};
        if (best == nullptr || rank < best_rank) {
          best = &id;
          best_rank = rank;
        }
      }
      if (best == nullptr) break;
      plan.holders.push_back(*best);
      if (best_rank.first) plan.roll_forward_squares = totals.at(step - 1);
    }
    if (plan.holders.size() == cut.size()) return plan;
  }
  return std::nullopt;
}

int64_t MinReplicas(const gpipe::v1::JobSpec& spec) {
  const int64_t r = ReplicaCount(spec);
  const int64_t min = spec.pipeline().min_replicas();
  return min > 0 ? std::min(min, r) : 1;
}

int64_t ElasticReplicas(const gpipe::v1::JobSpec& spec, int64_t stages,
                        int64_t free) {
  const int64_t groups = GradientGroupCount(spec);
  // A split backward runs one group on each replica (job_spec.cc): such a
  // job runs all its replicas or waits for workers.
  const bool one_each =
      SplitsBackward(ScheduleFromSpec(spec.pipeline().schedule()));
  for (int64_t r = ReplicaCount(spec); r >= MinReplicas(spec); --r) {
    if (r <= groups && (!one_each || r == groups) && stages * r <= free)
      return r;
  }
  return 0;
}

}  // namespace gpipe::controller
