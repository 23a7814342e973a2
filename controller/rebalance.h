// The controller's side of the self-balancing pipeline: it keeps what the
// stages of a job measured (JobRecord::layer_costs), decides at a
// committed checkpoint whether a re-partition pays (balancer.h), and
// reports how the new cut measured. The restart that moves the layers is
// the controller's (a Rebalance restart from that checkpoint, not counted),
// so the result stays bitwise that of the reference trainer.
#ifndef GPIPE_CONTROLLER_REBALANCE_H_
#define GPIPE_CONTROLLER_REBALANCE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "controller/job_table.h"
#include "gpipe/v1/controller.pb.h"

namespace gpipe::controller {

// Folds a progress report into the job: the stage's layer times into its
// cost book with its worker's start-up probe (Resources.probe_gflops); a
// stage that times no layers (on a GPU) by its busy time split by the cost
// model; the last stage's step time into the epoch's running estimate.
// Layer times of another length than the stage's layers, negative, NaN or
// over a day are ignored (false).
bool RecordStageTimes(JobRecord& job, const std::string& worker,
                      double probe_gflops, const gpipe::v1::StepProgress& p);

// At the committed checkpoint of `step`: the re-partition to make, when the
// job's pipeline.rebalance allows one now, every stage has measured long
// enough, the simulator predicts at least min_gain, the time the steps left
// save repays the steps replayed from the checkpoint and the restart (1 s,
// or 5 steps if more), and the new cut fits its workers
// (`memory_of`: a worker's memory for stages, 0 unknown); or, when the
// last re-partition measured slower than the cut before (MeasureRepartition),
// that cut again (reason "revert"), at once. The caller records it in
// status.repartitions, clears revert_pending and restarts the job. When the job
// could have moved but does not, `why` says why (else it is left empty).
std::optional<gpipe::v1::Repartition> PlanRepartition(
    JobRecord& job, int64_t step,
    const std::function<int64_t(const std::string& worker)>& memory_of,
    absl::Time now, std::string* why);

// Once the newest re-partition's cut has run long enough: its measured step
// time, set on the record, and a line for people; nullopt until then. A cut
// measured more than 3% slower than the one before sets revert_pending.
std::optional<std::string> MeasureRepartition(JobRecord& job);

// After a controller restart: whether the newest re-partition still waits
// for its measured step, or measured slower and waits to be undone (both
// read from status.repartitions, which the job store keeps).
void RecoverRebalanceState(JobRecord& job);

// The simulator's figures for the running cut from what the job measured:
// its step time (the gauge next to the measured one) and each worker's
// bubble (the cut's bubble the alert allows, by the stages' own times
// rather than the cost model's nominal machine). Zero and empty while a
// stage lacks measurements.
struct CutPrediction {
  double step_seconds = 0;
  std::vector<double> bubbles;  // stage 0's worker first
};
CutPrediction PredictRunningCut(const JobRecord& job);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_REBALANCE_H_
