// Elastic data-parallel replicas without a replay: when a worker of one
// replica is lost (or more workers become free), the job's workers keep
// their stages' states in memory at a step boundary (StageParked); the
// controller picks the newest step at which every stage has a surviving
// holder and starts the next epoch there with as many replicas as the free
// workers allow (the result does not depend on R), the holders as replica
// 0 and every other replica copying its stage's state from them. Only when
// no such step exists does the job fall back to its checkpoint.
#ifndef GPIPE_CONTROLLER_REPLICA_RESUME_H_
#define GPIPE_CONTROLLER_REPLICA_RESUME_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/v1/controller.pb.h"
#include "gpipe/v1/job.pb.h"

namespace gpipe::controller {

// Where the next epoch resumes from memory: after `step` steps, stage i's
// state held by worker holders[i], cut as `cut` (layer ranges).
struct MemoryResume {
  int64_t step = 0;
  std::vector<std::string> holders;
  std::vector<std::pair<int64_t, int64_t>> cut;
  // Set when a holder kept step - 1 with its update pending: the total of
  // squared gradients of step - 1 that rolls it forward.
  std::optional<double> roll_forward_squares;
};

// The newest step at which every stage of `cut` has a worker in `parked`
// (worker id -> what it kept) holding it for those layers and
// `available(worker id)`: having kept it, or having kept the step before
// with its update pending while another report tells that step's total
// (a cancel that lands while the pipeline passes the total back up leaves
// the last stages one step ahead of the first). Holders are the lowest
// replica holding it outright, else the lowest that rolls forward. nullopt
// when no step has a holder for every stage.
std::optional<MemoryResume> PlanMemoryResume(
    const std::vector<std::pair<int64_t, int64_t>>& cut,
    const std::map<std::string, gpipe::v1::StageParked>& parked,
    const std::function<bool(const std::string&)>& available);

// pipeline.min_replicas (0 means 1), at most R.
int64_t MinReplicas(const gpipe::v1::JobSpec& spec);

// The replicas a job of `stages` stages runs on `free` workers: the largest
// r <= R (and at most the spec's gradient groups) with stages x r <= free,
// not below MinReplicas; 0 when none fits. An r that does not divide the
// groups shares them unevenly (ReplicaGroups), with the same bits. A
// split-backward schedule (ZB-H1) takes only r = G, one group each.
int64_t ElasticReplicas(const gpipe::v1::JobSpec& spec, int64_t stages,
                        int64_t free);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_REPLICA_RESUME_H_
