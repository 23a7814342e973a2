// The self-balancing pipeline's arithmetic (pipeline.rebalance): what each
// layer costs and how fast each worker is, from the stages' running
// per-layer times, and the cut and stage-to-worker order the simulator
// predicts fastest. Pure: the controller decides when (at a committed
// checkpoint) and moves the layers (a restart from it, exact).
#ifndef GPIPE_CONTROLLER_BALANCER_H_
#define GPIPE_CONTROLLER_BALANCER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gpipe/v1/model.pb.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/simulator.h"

namespace gpipe::controller {

// Seconds per micro-batch.
struct LayerSeconds {
  double forward = 0;
  double backward = 0;
  // Split from a stage's busy time by the cost model, not timed per layer:
  // says nothing about how layers of one class compare across workers.
  bool split = false;
  // Seconds per step, not per micro-batch: the layer's share of its
  // stage's update (AddUpdateSeconds). Not part of total(), which is what
  // tells workers' speeds apart.
  double update = 0;
  double total() const { return forward + backward; }
};

// What one job's stages measured: each layer's seconds on each worker that
// ran it, the newest report winning. Kept across epochs: a layer seen on
// two workers is what tells their speeds apart.
class LayerCostBook {
 public:
  // Layers [layer_begin, layer_begin + layers.size()) ran on `worker`,
  // whose start-up probe measured `probe_gflops` (0: none).
  void Record(const std::string& worker, int64_t layer_begin,
              const std::vector<LayerSeconds>& layers, double probe_gflops = 0);

  // (layer, worker) -> seconds.
  const std::map<std::pair<int64_t, std::string>, LayerSeconds>& seen() const {
    return seen_;
  }
  // worker -> its probe's GFLOP/s, where it had one.
  const std::map<std::string, double>& probes() const { return probes_; }

 private:
  // Bounds the book when workers come and go for a long time: the entries
  // of the worker that reported least recently go first.
  static constexpr size_t kMaxWorkers = 64;

  std::map<std::pair<int64_t, std::string>, LayerSeconds> seen_;
  std::map<std::string, double> probes_;
  std::map<std::string, uint64_t> last_report_;  // worker -> report number
  uint64_t reports_ = 0;
};

// A stage whose worker reports no layer times (a GPU stage: the host clock
// sees only launches) still reports its busy seconds per step: split them
// over its layers in proportion to `model_costs` (the cost model's, one per
// layer of the stage), the backward twice the forward and a
// re-materializing stage's forward counted twice.
std::vector<LayerSeconds> LayerSecondsFromBusy(
    double busy_seconds, int64_t micro_batches, bool rematerializes,
    const std::vector<double>& model_costs);

// A stage's update seconds (once a step) over its layers in proportion to
// their parameter bytes (one entry per layer), as the optimizer's passes
// over parameters, gradients and their state take; evenly where no layer
// has parameters.
void AddUpdateSeconds(double update_seconds,
                      const std::vector<int64_t>& param_bytes,
                      std::vector<LayerSeconds>& layers);

struct CostEstimate {
  std::vector<LayerSeconds> layers;     // at speed 1
  std::map<std::string, double> speed;  // relative; geometric mean 1
  bool complete = false;                // every layer was measured
};

// Solves seconds(l, w) = cost(class(l)) / speed(w) in the least-squares
// sense on logarithms, weighting each measurement by its seconds. Layers of
// one class (LayerClasses: the same spec on the same input shape) cost the
// same, so a model that repeats a layer across stages (an MLP's hidden
// layers, a Transformer's blocks) tells its workers' speeds apart from the
// first measurements (timed layers only: a GPU stage's layers, split from
// its busy time, are each their own class). Workers that share no class keep
// the ratio of their start-up probes (worker/speed_probe.h; equal where there
// is none) until a layer has run on both (timed on both, or split on both).
CostEstimate EstimateCosts(const LayerCostBook& book,
                           const std::vector<int64_t>& layer_class);
// Every layer a class of its own.
CostEstimate EstimateCosts(const LayerCostBook& book, int64_t layers);

// A class id per layer: equal for layers with the same spec and input shape.
std::vector<int64_t> LayerClasses(const gpipe::v1::ModelSpec& model,
                                  const ModelShapes& shapes);

struct RebalanceInput {
  const ModelShapes* shapes = nullptr;
  int64_t micro_batches = 1;
  int64_t micro_batch_size = 1;
  ScheduleKind schedule = ScheduleKind::kGPipe;
  int64_t virtual_stages = 1;  // chunks per worker (v); balance has K x v
  RematMode remat = RematMode::kExceptLast;
  std::vector<int64_t> balance;      // the running cut
  std::vector<std::string> workers;  // the worker of each running stage
  CostEstimate costs;
  // The running cut's measured step (0: not known): what a gain is a
  // fraction of (ExpectedGain).
  double measured_step_seconds = 0;
  double min_gain = 0.10;
  // Cuts this job has run on their workers (CutKey): never proposed
  // again, so the job does not go back and forth between two cuts that
  // each look better measured from the other.
  std::set<std::string> tried;
  // Whether a cut fits its workers' memory (null: all fit).
  std::function<bool(const std::vector<int64_t>& balance,
                     const std::vector<std::string>& workers)>
      fits;
};

struct RebalanceProposal {
  std::vector<int64_t> balance;
  std::vector<std::string> workers;
  double predicted_old_seconds = 0;  // the simulator's step, running cut
  double predicted_new_seconds = 0;  // and proposed cut
  std::string reason;                // layer_costs | worker_speeds
};

// A split backward's weight half of a layer measured at `forward` and
// `backward` seconds: the parameters' products (as large as the forward's,
// less attention's products of activations: LayerCost::weight_flops), for
// a layer that defers one, within the backward measured; 0 for others.
double WeightHalfSeconds(const LayerCost& cost, double forward,
                         double backward);

// The simulation of `balance` with stage s on workers[s] at the measured
// layer costs, its layers' updates at the step's end included.
SimulationResult SimulateCut(const RebalanceInput& in,
                             const std::vector<int64_t>& balance,
                             const std::vector<std::string>& workers);
// SimulateCut's step time.
double PredictStepSeconds(const RebalanceInput& in,
                          const std::vector<int64_t>& balance,
                          const std::vector<std::string>& workers);

// The fastest cut: for each order of the running workers over the stages
// (all orders up to 6 stages, and orders x layers up to 100000, when
// their speeds differ by more than 5%; else the running order), the exact
// min-max cut by measured stage time (PartitionByStageCost), and of those the
// one the simulator predicts fastest. nullopt unless its ExpectedGain reaches
// min_gain, it fits and was not tried before, and the running cut's
// predicted compute is not over 1.5x its measured step (layer times that
// contradict the step they were part of); `why` (optional) then says which.
std::optional<RebalanceProposal> ProposeRebalance(const RebalanceInput& in,
                                                  std::string* why = nullptr);

// "4,4,4 on w1,w2,w3": a cut and its workers, for RebalanceInput::tried
// and messages.
std::string CutKey(const std::vector<int64_t>& balance,
                   const std::vector<std::string>& workers);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_BALANCER_H_
