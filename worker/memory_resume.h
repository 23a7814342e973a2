// Elastic replicas without a replay: a worker whose assignment ends keeps
// its stage's state (parameters and optimizer state, at a step boundary) in
// memory, and a new epoch of the same job resumes from it instead of a
// checkpoint. The replicas of a stage settle among themselves who holds the
// state at the epoch's start step and copy it from the lowest such replica
// over their reduction links, so a replica that joined (or one that was a
// step behind) starts from a live replica's bits.
#ifndef GPIPE_WORKER_MEMORY_RESUME_H_
#define GPIPE_WORKER_MEMORY_RESUME_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/pipeline/stage.h"
#include "services/transport/link.h"

namespace gpipe {

// A stage's state after `step` steps, as a checkpoint would hold it (every
// tensor by global name, on the host), for the job it belongs to. When the
// stage was cut off with the update of step `step` pending (its gradients
// final, Stage::pending_update), also those gradients: with the pipeline's
// total of squared gradients for that step it rolls forward to `step` + 1.
struct ParkedStage {
  std::string job_id;
  // The spec it was trained under (serialized): a job resumed with other
  // settings (more steps change the learning rate's schedule) holds other
  // bits at the same step.
  std::string spec;
  int64_t layer_begin = 0;
  int64_t layer_end = 0;
  int64_t step = 0;
  std::map<std::string, Tensor> state;
  bool pending = false;
  std::map<std::string, Tensor> grads;
  // And the step's batch norm statistics the update moves the running
  // averages by (Stage::pending_running_statistics; undefined without).
  Tensor running_statistics;
  // The stage's last applied update and its total of squared gradients
  // (Stage::last_update_step), for the controller's roll-forward plans.
  int64_t last_update_step = -1;
  double last_update_squares = 0;
};

// Bytes of the tensors `parked` holds.
int64_t ParkedBytes(const ParkedStage& parked);

// Copies `stage`'s state after `step` steps (and its gradients when the
// update of `step` is pending).
ParkedStage ParkStage(Stage& stage, const gpipe::v1::JobSpec& spec,
                      const std::string& job_id, int64_t step);

// Whether `parked` is `stage`'s state for `job_id` under `spec` after
// `step` steps.
bool HoldsState(const ParkedStage* parked, const Stage& stage,
                const gpipe::v1::JobSpec& spec, const std::string& job_id,
                int64_t step);

// Loads the state after `step` steps into `stage` (this is replica
// `replica`; `peers[q]` links to replica q of the stage, null for itself
// and for a stage of one replica): each replica tells the others whether
// `own` holds it; the lowest that does loads its own and sends it to those
// that do not, which load what they receive. A replica whose `own` was cut
// off with the update of `step` - 1 pending first rolls it forward with
// `roll_forward_squares` (that step's total, when known) and then holds
// it. Returns the replica the state came from. FAILED_PRECONDITION when no
// replica holds it; a peer's malformed message is INVALID_ARGUMENT naming
// it.
absl::StatusOr<int64_t> ResumeFromMemory(
    Stage& stage, const gpipe::v1::JobSpec& spec, int64_t replica,
    const std::vector<Link*>& peers, const ParkedStage* own,
    const std::string& job_id, int64_t step,
    std::optional<double> roll_forward_squares = std::nullopt);

}  // namespace gpipe

#endif  // GPIPE_WORKER_MEMORY_RESUME_H_
