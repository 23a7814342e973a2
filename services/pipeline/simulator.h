// A discrete-event simulation of one pipelined training step: each stage
// runs its schedule (schedule.h) in order, an op starts when its stage is
// free and its input has arrived over the link from the neighbour. Predicts
// step time, bubble fraction and peak activation memory per stage, in
// O(K * M) time, so configurations far larger than any test machine
// (K=128, M=1024) can be reasoned about instantly. It also proves a
// schedule runs: an op whose input never arrives leaves its stage stuck,
// which the result reports.
#ifndef GPIPE_SERVICES_PIPELINE_SIMULATOR_H_
#define GPIPE_SERVICES_PIPELINE_SIMULATOR_H_

#include <cstdint>
#include <vector>

#include "services/nn/layer_spec.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"

namespace gpipe {

// What one stage costs per micro-batch.
struct StageCost {
  double forward_seconds = 0;
  double backward_seconds = 0;  // excluding the recompute under remat
  // The part of backward_seconds that a split backward's weight half
  // takes (the rest is its input half).
  double weight_seconds = 0;
  int64_t input_bytes = 0;     // boundary input: what remat keeps
  int64_t internal_bytes = 0;  // every activation kept without remat
  int64_t output_bytes = 0;    // sent downstream (its gradient comes back)
  // Kept between a split backward's halves: the GEMMs' output gradients.
  int64_t deferred_bytes = 0;
  // Once a step, after the stage's last op: the pass that sums its
  // gradients' squares (before it waits for the running sum from
  // upstream) and the update once the global total is back (the optimizer,
  // zeroing the gradients, and re-packing the weights for the next step's
  // products).
  double norm_seconds = 0;
  double update_seconds = 0;
};

struct SimulationConfig {
  // K entries, or K x v under a schedule with chunks (in model order; the
  // schedule places them on workers: StageOfChunk).
  std::vector<StageCost> stages;
  int64_t micro_batches = 1;  // M
  ScheduleKind schedule = ScheduleKind::kGPipe;
  int64_t virtual_stages = 1;  // v, chunks per worker (interleaved only)
  // Each worker's ops, when given (K lists), instead of MakeWorkerSchedule's
  // for `schedule` (which then says only how many chunks a worker holds);
  // lists without transfers get them (WithTransfers).
  std::vector<std::vector<Op>> ops;
  RematMode remat = RematMode::kNever;
  // Each direction of each neighbour link carries one tensor at a time;
  // latency overlaps with the next transfer.
  double link_bytes_per_second = 1e10;
  double link_latency_seconds = 0;
  // What each message between workers costs on top of its bytes and the
  // link's latency: framing, system calls, waking the receiver. It delays
  // the message like latency does.
  double message_seconds = 0;
  // Whether a send holds its stage until the message's bytes are through
  // the link. Over gRPC a message larger than the stream's flow-control
  // window waits for the receiver's window updates, so a slow link stalls
  // the sender (measured on a 1 Gbit/s link: the step grew by what the
  // transfers take, and the stages' busy time with it); the shared-memory
  // plane's ring takes a message at once.
  bool sends_wait_for_link = false;
  // The phase times ZB-V's order is built for (MakeWorkerSchedule), when
  // they differ from `stages` (a simulation with measured costs of the
  // order the runtime builds from the cost model: CostModelTicks). Empty:
  // ScheduleTicks(stages, remat). Unused when `ops` is given.
  std::vector<PhaseTicks> order_ticks;
  // Links that copy each message twice on the stages' own threads (the
  // in-process pipeline's: the sender out of its activation memory, the
  // receiver into its own allocator), a worker's own chunks' links too.
  // Each copy holds its thread for bytes / copy_bytes_per_second; 0 counts
  // none. The sender's copy is busy time (the stage records it with the op
  // that made the message), the receiver's is wait.
  double copy_bytes_per_second = 0;
};

struct StageSimulation {
  // forward + backward + recompute + update: the ops a stage records (the
  // squares pass before the gradient-norm exchange is not one, so it counts
  // as bubble, as in the stages' own reports)
  double busy_seconds = 0;
  double bubble_fraction = 0;  // (step - busy) / step
  int64_t peak_activation_bytes = 0;
};

struct SimulationResult {
  // Until the last stage finishes its update. Every step ends with the
  // gradient-norm exchange: each stage, after its last op, sums its
  // gradients' squares into the running sum from upstream and passes it
  // down the pipe; the last stage sends the total back up, and each stage
  // passes it on before its update.
  double step_seconds = 0;
  // Per worker: one per stage, or under an interleaved schedule one per
  // worker with its chunks' figures together.
  std::vector<StageSimulation> stages;
  // Every op of every stage ran. False means the schedule deadlocks: some
  // stage waits for an input no other stage will produce, or one that comes
  // behind another on its link (links deliver in order), or runs a weight
  // half without its input half.
  bool complete = true;
  // The most messages waiting on one direction of one link at once: what
  // the links' capacity must hold (they take M + 4).
  int64_t max_link_messages = 0;
};

// Requires at least one stage and micro_batches >= 1, non-negative costs
// and a positive bandwidth (the planner's inputs; not user-facing).
SimulationResult Simulate(const SimulationConfig& config);
// A simulation's bubble of each worker; empty when it did not complete.
std::vector<double> WorkerBubbles(const SimulationResult& r);

// The bubble fraction of `schedule` on K equal workers with M micro-batches
// (a worker's forward 1, backward 2, split into input and weight halves of
// 1 each; under an interleaved schedule shared by its v chunks; no transfer
// time): the figure each schedule is measured against, (K-1)/(M+K-1) for
// GPipe and 1F1B, (K-1)/(3M+K-1) for ZB-H1 with M >= K, (K-1)/(vM+K-1) for
// interleaved 1F1B, about (K-1)/(6M+K-1) for ZB-V.
double TheoreticalBubble(ScheduleKind schedule, int64_t stages,
                         int64_t micro_batches, int64_t virtual_stages = 1);

// StageCosts of a partition: forward = sum of the stage's layer seconds
// (per micro-batch), backward = 2x forward (1x for the model's first
// layer, which computes no input gradient) of which the weight half is the
// forward of the layers with parameters, internal bytes = sum of the
// layers' output activation bytes, input / output bytes = the stage's
// boundary tensors (4 bytes an element), deferred bytes = the layers'
// deferred gradients, all for `micro_batch_size` samples.
std::vector<StageCost> StageCostsFromLayers(
    const ModelShapes& shapes, const std::vector<double>& layer_forward_seconds,
    const std::vector<int64_t>& balance, int64_t micro_batch_size);

// ZB-V's phase times for stage costs (schedule.h's PhaseTicks): each
// stage's forward, input half (with the forward again where the stage
// re-materializes under `remat`) and weight half, in thousandths of the
// longest of them, at least one tick each.
std::vector<PhaseTicks> ScheduleTicks(const std::vector<StageCost>& stages,
                                      RematMode remat);
// ScheduleTicks of the cost model's stage costs for a partition (`balance`:
// layers per stage, all K x v of them): what the in-process pipeline and
// the controller give ZB-V, the same wherever they are computed.
std::vector<PhaseTicks> CostModelTicks(const ModelShapes& shapes,
                                       const std::vector<int64_t>& balance,
                                       RematMode remat);

// The step the cost model predicts for a cut (`balance`, K x v stages) of
// a batch of `batch_size` in M micro-batches on a nominal machine (compute,
// each op's fixed cost, the update's memory traffic: `update_traffic`
// bytes moved per parameter byte), links free, with each worker's bubble:
// what a cut allows, its unequal stages included.
SimulationResult CostModelSimulation(const ModelShapes& shapes,
                                     const std::vector<int64_t>& balance,
                                     int64_t micro_batches,
                                     ScheduleKind schedule,
                                     int64_t virtual_stages, RematMode remat,
                                     int64_t batch_size, double update_traffic);
// Each worker's bubble (stage 0's worker first) that the cost model
// predicts for this cut of `spec`'s model (`balance`: layers per stage, K x
// v of them, in model order) under `kind` and `remat` with M micro-batches
// of a batch of `batch` (CostModelSimulation): a cut's unequal stages leave
// the lighter ones idle beyond the schedule's theory. gpipectl's progress
// line shows it, and the controller hands each worker its own (the
// gpipe_stage_bubble_predicted_ratio metric). Empty where the model or the
// cut cannot be simulated.
std::vector<double> CutBubbles(const gpipe::v1::JobSpec& spec,
                               ScheduleKind kind, RematMode remat,
                               const std::vector<int64_t>& balance, int64_t m,
                               int64_t v, int64_t batch);

// CostModelSimulation's step; infinite where the schedule does not
// complete. What chooses between cuts that balance differently
// (PartitionForSchedule's ZB-V cut).
double CostModelStepSeconds(const ModelShapes& shapes,
                            const std::vector<int64_t>& balance,
                            int64_t micro_batches, ScheduleKind schedule,
                            int64_t virtual_stages, RematMode remat,
                            int64_t batch_size, double update_traffic);

// Bytes each parameter's update moves, in units of the parameter's own
// bytes, for the optimizer of `spec`: it reads the parameter and its
// gradient and writes the parameter, reads and writes each state tensor,
// and zeroes the gradient.
double UpdateTraffic(const gpipe::v1::OptimizerSpec& spec);

// The fraction of a measured step that going from the simulator's
// `old_seconds` to its `new_seconds` saves: the smaller of the simulator's
// own ratio and the seconds it saves over `measured_seconds` (the simulator
// sees compute only; transfers and fixed costs stay as they are, so on a
// small model a large compute gain is a small step gain). The ratio alone
// when nothing was measured.
double ExpectedGain(double old_seconds, double new_seconds,
                    double measured_seconds);

// The step time `measured_seconds` becomes at ExpectedGain.
double ExpectedStepSeconds(double old_seconds, double new_seconds,
                           double measured_seconds);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_SIMULATOR_H_
