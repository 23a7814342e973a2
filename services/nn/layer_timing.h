// What each layer of a model costs as it trains: per-layer forward and
// backward seconds on the host clock, the input of the self-balancing
// pipeline (controller/balancer.h). Timing a layer is two clock reads, far
// below any layer's own cost. On a GPU the host clock sees kernel launches,
// not kernels, so GPU stages do not time their layers.
#ifndef GPIPE_SERVICES_NN_LAYER_TIMING_H_
#define GPIPE_SERVICES_NN_LAYER_TIMING_H_

#include <chrono>
#include <cstdint>
#include <vector>

namespace gpipe {

class LayerTiming {
 public:
  // `layers`: the model's layer count. `slowdown` >= 1 makes every layer
  // take that many times as long (the rest slept away, the CPU left free):
  // a worker that stands for a slower machine in tests and benchmarks.
  explicit LayerTiming(int64_t layers, double slowdown = 1.0);

  // Called by Model around each layer; `record` false for passes that are
  // not counted (re-materialization, evaluation), which still slow down.
  void Finished(int64_t local, bool backward, bool record,
                std::chrono::steady_clock::time_point start);

  // Ends a step of `micro_batches`: folds this step's per-micro-batch
  // seconds into the running estimates and starts the next step's sums.
  // The first step after construction only warms up (allocations, caches)
  // and is not folded in.
  void EndStep(int64_t micro_batches);

  // Running estimates of each layer's seconds per micro-batch: the median
  // of its last kWindowSteps steps (fewer until that many ended); empty
  // until a step was folded in. A median, not a mean: on a shared machine
  // a microsecond layer is now and then preempted for milliseconds, and
  // one such step would otherwise make it look a thousand times its cost
  // to the balancer for several steps.
  const std::vector<double>& forward_seconds() const { return forward_; }
  const std::vector<double>& backward_seconds() const { return backward_; }

  // Steps the estimates look back over: a spike in fewer than half of them
  // moves nothing, a lasting change shows within half of them.
  static constexpr int kWindowSteps = 9;

 private:
  double slowdown_;
  double owed_seconds_ = 0;  // slowdown sleep not yet taken
  int64_t steps_ended_ = 0;
  std::vector<double> step_forward_, step_backward_;  // this step's sums
  // The last kWindowSteps steps' per-micro-batch seconds, layer-major
  // (layer l's at [l * kWindowSteps, (l + 1) * kWindowSteps)), filled
  // round-robin; `folded_` steps so far.
  std::vector<double> window_forward_, window_backward_;
  std::vector<double> scratch_;  // one layer's window, for its median
  int64_t folded_ = 0;
  std::vector<double> forward_, backward_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYER_TIMING_H_
