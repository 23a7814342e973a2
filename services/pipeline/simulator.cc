#include "services/pipeline/simulator.h"

#include <algorithm>

namespace gpipe {
namespace {

// Times below zero mean "not yet known": every real time is >= 0.
constexpr double kUnknown = -1.0;

// Peak activation bytes of one stage running `ops`: a stage is one
// sequential worker, so walking its ops in order visits every moment its
// memory can peak.
int64_t PeakActivationBytes(const std::vector<Op>& ops, const StageCost& cost,
                            bool remat) {
  int64_t live = 0, peak = 0;
  for (const Op& op : ops) {
    if (op.kind == OpKind::kForward) {
      ++live;
      // Without remat the forward leaves all its activations behind; with
      // remat only the input stays (the forward's own temporaries pass).
      const int64_t held =
          remat ? live * cost.input_bytes
                : live * (cost.input_bytes + cost.internal_bytes);
      peak = std::max(peak, held);
    } else if (op.kind == OpKind::kBackward) {
      // Under remat the backward first rebuilds this micro-batch's
      // activations; without it they are already counted.
      if (remat) {
        peak = std::max(peak, live * cost.input_bytes + cost.internal_bytes);
      }
      --live;
    }
  }
  return peak;
}

}  // namespace

SimulationResult Simulate(const SimulationConfig& config) {
  const int64_t k = static_cast<int64_t>(config.stages.size());
  const int64_t m = config.micro_batches;
  SimulationResult result;
  result.stages.resize(k);
  if (k == 0 || m < 1) return result;

  std::vector<std::vector<Op>> ops(k);
  for (int64_t s = 0; s < k; ++s) {
    ops[s] = MakeSchedule(config.schedule, k, m, s);
  }
  // When the input of F(s, i) / the output gradient of B(s, i) arrives.
  std::vector<double> forward_ready(k * m, kUnknown);
  std::vector<double> backward_ready(k * m, kUnknown);
  for (int64_t i = 0; i < m; ++i) {
    forward_ready[i] = 0;                 // stage 0 reads its data
    backward_ready[(k - 1) * m + i] = 0;  // the last stage has the loss
  }
  std::vector<size_t> next(k, 0);
  std::vector<double> free_at(k, 0);
  // One transfer at a time per direction of each link: down_link[s] carries
  // s -> s+1 activations, up_link[s] carries s -> s-1 gradients.
  std::vector<double> down_link(k, 0), up_link(k, 0);
  const double latency = config.link_latency_seconds;
  const auto transfer = [&](std::vector<double>& link, int64_t s, double sent,
                            int64_t bytes) {
    const double start = std::max(sent, link[s]);
    link[s] = start + static_cast<double>(bytes) / config.link_bytes_per_second;
    return link[s] + latency;
  };

  // Each stage runs ops until one waits for a neighbour; finishing an op
  // wakes the neighbour it feeds. An op's start time depends only on its
  // stage's previous op and its input's arrival, so this order of evaluation
  // gives the same times as processing events in time order, with O(1) work
  // per op.
  std::vector<int64_t> runnable(k);
  for (int64_t s = 0; s < k; ++s) runnable[s] = k - 1 - s;
  while (!runnable.empty()) {
    const int64_t s = runnable.back();
    runnable.pop_back();
    const StageCost& cost = config.stages[s];
    const bool remat = StageRematerializes(config.remat, s, k);
    StageSimulation& sim = result.stages[s];
    while (next[s] < ops[s].size()) {
      const Op& op = ops[s][next[s]];
      if (op.kind == OpKind::kOptimizerStep) {
        ++next[s];
        continue;
      }
      const bool forward = op.kind == OpKind::kForward;
      const double ready = forward ? forward_ready[s * m + op.micro_batch]
                                   : backward_ready[s * m + op.micro_batch];
      if (ready < 0) break;  // a neighbour will wake this stage
      const double seconds =
          forward ? cost.forward_seconds
                  : cost.backward_seconds + (remat ? cost.forward_seconds : 0);
      const double end = std::max(free_at[s], ready) + seconds;
      free_at[s] = end;
      sim.busy_seconds += seconds;
      ++next[s];
      if (forward && s + 1 < k) {
        forward_ready[(s + 1) * m + op.micro_batch] =
            transfer(down_link, s, end, cost.output_bytes);
        runnable.push_back(s + 1);
      } else if (!forward && s > 0) {
        backward_ready[(s - 1) * m + op.micro_batch] =
            transfer(up_link, s, end, config.stages[s - 1].output_bytes);
        runnable.push_back(s - 1);
      }
    }
  }

  for (int64_t s = 0; s < k; ++s) {
    result.step_seconds = std::max(result.step_seconds, free_at[s]);
  }
  for (int64_t s = 0; s < k; ++s) {
    StageSimulation& sim = result.stages[s];
    sim.bubble_fraction =
        result.step_seconds > 0
            ? (result.step_seconds - sim.busy_seconds) / result.step_seconds
            : 0;
    sim.peak_activation_bytes = PeakActivationBytes(
        ops[s], config.stages[s], StageRematerializes(config.remat, s, k));
  }
  return result;
}

std::vector<StageCost> StageCostsFromLayers(
    const ModelShapes& shapes, const std::vector<double>& layer_forward_seconds,
    const std::vector<int64_t>& balance, int64_t micro_batch_size) {
  std::vector<StageCost> stages(balance.size());
  int64_t begin = 0;
  for (size_t s = 0; s < balance.size(); ++s) {
    const int64_t end = begin + balance[s];
    StageCost& c = stages[s];
    for (int64_t l = begin; l < end; ++l) {
      c.forward_seconds += layer_forward_seconds[l];
      c.internal_bytes += shapes.costs[l].activation_bytes * micro_batch_size;
    }
    c.backward_seconds = 2 * c.forward_seconds;
    c.input_bytes = shapes.inputs[begin].numel() * 4 * micro_batch_size;
    c.output_bytes = shapes.outputs[end - 1].numel() * 4 * micro_batch_size;
    begin = end;
  }
  return stages;
}

double ExpectedGain(double old_seconds, double new_seconds,
                    double measured_seconds) {
  if (!(old_seconds > 0)) return 0;
  const double ratio = 1 - new_seconds / old_seconds;
  if (!(measured_seconds > 0)) return ratio;
  return std::min(ratio, (old_seconds - new_seconds) / measured_seconds);
}

double ExpectedStepSeconds(double old_seconds, double new_seconds,
                           double measured_seconds) {
  return measured_seconds *
         (1 - ExpectedGain(old_seconds, new_seconds, measured_seconds));
}

}  // namespace gpipe
