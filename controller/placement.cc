#include "controller/placement.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "services/core/bytes.h"
#include "services/core/status.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/partitioner.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;

bool Holds(int64_t memory, const StageMemory& need) {
  return memory <= 0 || need.total() <= memory;
}

size_t LargestStage(const StagePlan& plan) {
  size_t largest = 0;
  for (size_t s = 1; s < plan.memory.size(); ++s) {
    if (plan.memory[s].total() > plan.memory[largest].total()) largest = s;
  }
  return largest;
}

}  // namespace

std::vector<int64_t> WorkerMemory(
    const std::vector<std::shared_ptr<WorkerRecord>>& workers) {
  std::vector<int64_t> memory;
  memory.reserve(workers.size());
  for (const auto& w : workers) {
    memory.push_back(w->info.resources().memory_bytes());
  }
  return memory;
}

absl::StatusOr<StagePlan> PlanStages(const v1::JobSpec& spec, int64_t k,
                                     const std::vector<int64_t>& balance) {
  // Fewer stages than asked (elastic): the cost model cuts the k stages.
  StagePlan plan;
  if (static_cast<int64_t>(balance.size()) == k) {
    plan.balance = balance;
  } else {
    ASSIGN_OR_RETURN(plan.balance, PartitionJobAt(spec, k));
  }
  ASSIGN_OR_RETURN(const ModelShapes shapes, InferModelShapes(spec.model()));
  plan.memory = EstimatePipelineMemory(spec, shapes, plan.balance);
  return plan;
}

StagePlan WorkerPlan(const StagePlan& chunks, ScheduleKind schedule,
                     int64_t workers) {
  StagePlan out;
  if (workers <= 0) return out;
  std::vector<std::vector<StageMemory>> mine(workers);
  for (size_t s = 0; s < chunks.memory.size(); ++s)
    mine[WorkerOfStage(schedule, workers, static_cast<int64_t>(s))].push_back(
        chunks.memory[s]);
  for (const auto& m : mine) out.memory.push_back(Combined(m));
  out.balance = chunks.balance;
  return out;
}

bool StagesFit(const StagePlan& plan, const std::vector<int64_t>& memory) {
  if (memory.size() < plan.memory.size()) return false;
  for (size_t s = 0; s < plan.memory.size(); ++s) {
    if (!Holds(memory[s], plan.memory[s])) return false;
  }
  return true;
}

StagePlan RepeatPlan(const StagePlan& plan, int64_t times) {
  StagePlan out;
  for (int64_t r = 0; r < times; ++r) {
    out.balance.insert(out.balance.end(), plan.balance.begin(),
                       plan.balance.end());
    out.memory.insert(out.memory.end(), plan.memory.begin(), plan.memory.end());
  }
  return out;
}

std::optional<std::vector<size_t>> PlaceStages(
    const StagePlan& plan, const std::vector<int64_t>& worker_memory,
    std::string* why) {
  const size_t k = plan.memory.size();
  if (worker_memory.size() < k) {
    *why =
        absl::StrCat("needs ", k, " workers, ", worker_memory.size(), " free");
    return std::nullopt;
  }
  std::vector<size_t> out(k);
  bool in_order = true;
  for (size_t s = 0; s < k; ++s) {
    out[s] = s;
    in_order = in_order && Holds(worker_memory[s], plan.memory[s]);
  }
  if (in_order) return out;

  // Largest need first, each on the smallest worker that holds it (unknown
  // memory counts as the largest): if any assignment fits, this one does.
  std::vector<size_t> stages(k);
  std::iota(stages.begin(), stages.end(), 0);
  std::stable_sort(stages.begin(), stages.end(), [&](size_t a, size_t b) {
    return plan.memory[a].total() > plan.memory[b].total();
  });
  const auto size = [&](size_t w) {
    return worker_memory[w] <= 0 ? std::numeric_limits<int64_t>::max()
                                 : worker_memory[w];
  };
  std::vector<bool> taken(worker_memory.size(), false);
  for (size_t s : stages) {
    std::optional<size_t> best;
    for (size_t w = 0; w < worker_memory.size(); ++w) {
      if (taken[w] || !Holds(worker_memory[w], plan.memory[s])) continue;
      if (!best || size(w) < size(*best)) best = w;
    }
    if (!best) {
      int64_t largest = 0;
      for (size_t w = 0; w < worker_memory.size(); ++w) {
        if (!taken[w]) largest = std::max(largest, worker_memory[w]);
      }
      *why = absl::StrCat("stage ", s, " needs ", plan.memory[s].ToString(),
                          ", the largest free worker left has ",
                          FormatBytes(largest), " for stages");
      return std::nullopt;
    }
    taken[*best] = true;
    out[s] = *best;
  }
  return out;
}

absl::Status CheckFitsCluster(const StagePlan& plan,
                              const std::vector<int64_t>& worker_memory) {
  if (plan.memory.empty() || worker_memory.empty()) return absl::OkStatus();
  int64_t largest = 0;
  for (int64_t m : worker_memory) {
    if (m <= 0) return absl::OkStatus();  // unknown: may hold anything
    largest = std::max(largest, m);
  }
  const size_t s = LargestStage(plan);
  const StageMemory& m = plan.memory[s];
  if (Holds(largest, m)) return absl::OkStatus();
  // An evaluation batch larger than a training step's peak is what a cut
  // cannot shrink: more stages left such a job over the budget.
  const std::string advice =
      m.evaluation > m.training()
          ? absl::StrCat("its evaluation batch, ", FormatBytes(m.evaluation),
                         ", is more than its training step holds: a smaller "
                         "eval.batchSize needs less")
          : "more stages, micro-batches or re-materialization need less";
  return absl::FailedPreconditionError(absl::StrCat(
      "stage ", s, " needs ", m.ToString(), ", the largest worker has ",
      FormatBytes(largest), " for stages (", advice, ": see gpipectl plan)"));
}

}  // namespace gpipe::controller
