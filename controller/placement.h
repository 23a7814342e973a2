// Which worker runs which stage, by memory: the memory model
// (services/pipeline/memory_model.h) says what each stage of a cut needs,
// workers say what their stages may hold (WorkerHello.resources), and a job
// is placed only where every stage fits. The same figures refuse at
// submission a job that no worker of the cluster could hold.
#ifndef GPIPE_CONTROLLER_PLACEMENT_H_
#define GPIPE_CONTROLLER_PLACEMENT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/worker_registry.h"
#include "gpipe/v1/job.pb.h"
#include "services/pipeline/memory_model.h"
#include "services/pipeline/schedule.h"

namespace gpipe::controller {

// A job cut into k stages: the layers of each and what each needs.
struct StagePlan {
  std::vector<int64_t> balance;
  std::vector<StageMemory> memory;
};

// `balance` when it has k entries (the balancer's cut), else PartitionJobAt
// (an explicit balance only when k is the spec's K); and the memory model
// of each stage. Errors: the spec cannot be cut into k.
absl::StatusOr<StagePlan> PlanStages(const gpipe::v1::JobSpec& spec, int64_t k,
                                     const std::vector<int64_t>& balance = {});

// `plan`'s stages `times` over, one copy per data-parallel replica: every
// replica's stage i needs what stage i needs.
StagePlan RepeatPlan(const StagePlan& plan, int64_t times);

// A plan's K x v chunks folded onto its K workers as `schedule` places
// them (StageOfChunk): worker w needs what its chunks need together, part by
// part.
StagePlan WorkerPlan(const StagePlan& chunks, ScheduleKind schedule,
                     int64_t workers);

// Whether each stage of `plan` fits the worker's memory (0: unknown, holds
// anything) at the same index.
bool StagesFit(const StagePlan& plan, const std::vector<int64_t>& memory);

// What each of `workers` says its stages may hold, in order (0: not said).
std::vector<int64_t> WorkerMemory(
    const std::vector<std::shared_ptr<WorkerRecord>>& workers);

// For each stage, the index into `worker_memory` (bytes each free worker's
// stages may hold, in the scheduler's order; 0: unknown, holds anything) of
// the worker that runs it. The first k workers in order when each holds its
// stage (so placement is by attach order whenever memory allows); else the
// stages by decreasing need, each on the smallest worker that holds it.
// nullopt when no assignment fits; `why` then says which stage needs what
// and the largest worker's memory.
std::optional<std::vector<size_t>> PlaceStages(
    const StagePlan& plan, const std::vector<int64_t>& worker_memory,
    std::string* why);

// OK, or FAILED_PRECONDITION when the largest stage of the job cut into its
// K stages needs more than the largest of `worker_memory` (all the
// cluster's workers, busy or not): "stage 2 needs 18.6 GiB (...), the
// largest worker has 8.00 GiB for stages". Workers of unknown memory, or
// none at all, pass.
absl::Status CheckFitsCluster(const StagePlan& plan,
                              const std::vector<int64_t>& worker_memory);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_PLACEMENT_H_
