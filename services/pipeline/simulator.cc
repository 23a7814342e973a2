#include "services/pipeline/simulator.h"

#include <algorithm>

namespace gpipe {
namespace {

// Times below zero mean "not yet known": every real time is >= 0.
constexpr double kUnknown = -1.0;

// Peak activation bytes of one stage running `ops`: a stage is one
// sequential worker, so walking its ops in order visits every moment its
// memory can peak.
// A micro-batch between its split backward's halves holds its activations
// (counted whole: an upper bound, as in the memory model) and its deferred
// gradients.
int64_t PeakActivationBytes(const std::vector<Op>& ops, const StageCost& cost,
                            bool remat) {
  // `waiting`: forwarded, backward not started; `deferred`: between halves.
  int64_t waiting = 0, deferred = 0, peak = 0;
  const int64_t whole = cost.input_bytes + cost.internal_bytes;
  const auto held = [&] {
    // Without remat the forward leaves all its activations behind; with
    // remat only the input stays (the forward's own temporaries pass).
    return waiting * (remat ? cost.input_bytes : whole) +
           deferred * (whole + cost.deferred_bytes);
  };
  for (const Op& op : ops) {
    switch (op.kind) {
      case OpKind::kForward:
        ++waiting;
        peak = std::max(peak, held());
        break;
      case OpKind::kBackward:
      case OpKind::kBackwardInput:
        // Under remat the backward first rebuilds this micro-batch's
        // activations; without it they are already counted.
        if (remat) {
          peak = std::max(peak, held() - cost.input_bytes + whole);
        }
        --waiting;
        if (op.kind == OpKind::kBackwardInput) {
          ++deferred;
          peak = std::max(peak, held());
        }
        break;
      case OpKind::kBackwardWeight:
        --deferred;
        break;
      case OpKind::kOptimizerStep:
        break;
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

  std::vector<std::vector<Op>> ops = config.ops;
  if (static_cast<int64_t>(ops.size()) != k) {
    ops.assign(k, {});
    for (int64_t s = 0; s < k; ++s)
      ops[s] = MakeSchedule(config.schedule, k, m, s);
  }
  // Links deliver in the order they were sent, as the real ones do:
  // to_next[s] holds what stage s sent to s+1 (activations), to_prev[s] what
  // stage s+1 sent to s (gradients), each as (micro-batch, arrival), and
  // taken[s] how many of each the receiver has consumed. A receive whose
  // micro-batch is not the next one sent never runs.
  struct Message {
    int64_t micro_batch;
    double arrival;
  };
  std::vector<std::vector<Message>> to_next(k), to_prev(k);
  std::vector<size_t> taken_next(k, 0), taken_prev(k, 0);
  // When F(s, i) and the input half of (s, i) ended: the last stage's
  // backward needs its forward, a weight half its input half.
  std::vector<double> forward_done(k * m, kUnknown);
  std::vector<double> input_done(k * m, kUnknown);
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
  // The arrival of `i` at the head of a link's queue; kUnknown while
  // nothing is there, and forever when another micro-batch is.
  const auto receive = [&](const std::vector<Message>& queue, size_t taken,
                           int64_t i) {
    if (taken >= queue.size() || queue[taken].micro_batch != i) return kUnknown;
    return queue[taken].arrival;
  };
  const auto waiting = [](const std::vector<Message>& queue, size_t taken) {
    return static_cast<int64_t>(queue.size() - taken);
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
      const int64_t i = op.micro_batch;
      if (i < 0 || i >= m) break;  // never runs
      const bool forward = op.kind == OpKind::kForward;
      const bool weight = op.kind == OpKind::kBackwardWeight;
      double ready = kUnknown;
      if (weight) {
        ready = input_done[s * m + i];
      } else if (forward) {
        ready = s == 0 ? 0 : receive(to_next[s - 1], taken_next[s - 1], i);
      } else {
        ready = s == k - 1 ? forward_done[s * m + i]
                           : receive(to_prev[s], taken_prev[s], i);
        // Its own forward first, on every stage.
        if (forward_done[s * m + i] < 0) ready = kUnknown;
      }
      if (ready < 0) break;  // a neighbour will wake this stage, or none
      double seconds = cost.forward_seconds;
      if (weight) {
        seconds = cost.weight_seconds;
      } else if (!forward) {
        seconds = cost.backward_seconds + (remat ? cost.forward_seconds : 0);
        if (op.kind == OpKind::kBackwardInput) seconds -= cost.weight_seconds;
      }
      const double end = std::max(free_at[s], ready) + seconds;
      free_at[s] = end;
      sim.busy_seconds += seconds;
      ++next[s];
      if (weight) {
        input_done[s * m + i] = kUnknown;  // a second W of it never runs
        continue;
      }
      if (forward) {
        forward_done[s * m + i] = end;
        if (s > 0) ++taken_next[s - 1];
        if (s + 1 < k) {
          to_next[s].push_back(
              {i, transfer(down_link, s, end, cost.output_bytes)});
          result.max_link_messages = std::max(
              result.max_link_messages, waiting(to_next[s], taken_next[s]));
          runnable.push_back(s + 1);
        }
        continue;
      }
      if (op.kind == OpKind::kBackwardInput) input_done[s * m + i] = end;
      if (s + 1 < k) ++taken_prev[s];
      if (s > 0) {
        to_prev[s - 1].push_back(
            {i, transfer(up_link, s, end, config.stages[s - 1].output_bytes)});
        result.max_link_messages =
            std::max(result.max_link_messages,
                     waiting(to_prev[s - 1], taken_prev[s - 1]));
        runnable.push_back(s - 1);
      }
    }
  }

  for (int64_t s = 0; s < k; ++s) {
    result.step_seconds = std::max(result.step_seconds, free_at[s]);
    result.complete = result.complete && next[s] == ops[s].size();
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

double TheoreticalBubble(ScheduleKind schedule, int64_t stages,
                         int64_t micro_batches) {
  if (stages <= 1 || micro_batches <= 0) return 0.0;
  SimulationConfig config;
  StageCost unit;
  unit.forward_seconds = 1;
  unit.backward_seconds = 2;
  unit.weight_seconds = 1;
  config.stages.assign(stages, unit);
  config.micro_batches = micro_batches;
  config.schedule = schedule;
  config.link_bytes_per_second = 1;  // nothing is sent: no bytes
  const SimulationResult r = Simulate(config);
  return r.step_seconds > 0 ? r.stages[0].bubble_fraction : 0.0;
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
      const LayerCost& cost = shapes.costs[l];
      const double f = layer_forward_seconds[l];
      c.forward_seconds += f;
      // The input and the weight gradient are each a product as large as
      // the forward. (The model's first layer skips the input gradient, but
      // its stage also gathers the batch: counted as 2x, the first stage
      // measures closer to what it does.)
      c.backward_seconds += 2 * f;
      if (cost.param_bytes > 0) c.weight_seconds += f;
      c.internal_bytes += cost.activation_bytes * micro_batch_size;
      c.deferred_bytes += cost.deferred_bytes * micro_batch_size;
    }
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
