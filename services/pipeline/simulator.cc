#include "services/pipeline/simulator.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "services/nn/layer.h"
#include "services/pipeline/partitioner.h"

namespace gpipe {
namespace {

// Times below zero mean "not yet known": every real time is >= 0.
constexpr double kUnknown = -1.0;

// Peak activation bytes of one worker running `ops` over its chunks (placed
// among `stages` as `kind` places them): a worker is sequential, so walking
// its ops in order visits every moment its memory can peak. A micro-batch
// between its split backward's halves holds its activations (counted whole:
// an upper bound; the memory model counts only what the weight half reads)
// and its deferred gradients.
int64_t PeakActivationBytes(const std::vector<Op>& ops,
                            const std::vector<StageCost>& stages,
                            const std::vector<bool>& remat, ScheduleKind kind,
                            int64_t workers, int64_t worker) {
  struct Held {
    int64_t waiting = 0;   // forwarded, backward not started
    int64_t deferred = 0;  // between a split backward's halves
  };
  std::vector<Held> chunks;
  int64_t peak = 0;
  const auto stage_of = [&](int64_t c) {
    return StageOfChunk(kind, workers, worker, c);
  };
  const auto whole = [&](int64_t c) {
    const StageCost& cost = stages[stage_of(c)];
    return cost.input_bytes + cost.internal_bytes;
  };
  const auto held = [&] {
    int64_t bytes = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      const StageCost& cost = stages[stage_of(c)];
      // Without remat the forward leaves all its activations behind; with
      // remat only the input stays (the forward's own temporaries pass).
      bytes += chunks[c].waiting *
                   (remat[stage_of(c)] ? cost.input_bytes : whole(c)) +
               chunks[c].deferred * (whole(c) + cost.deferred_bytes);
    }
    return bytes;
  };
  for (const Op& op : ops) {
    if (op.kind == OpKind::kOptimizerStep) continue;
    if (op.chunk >= static_cast<int64_t>(chunks.size()))
      chunks.resize(op.chunk + 1);
    Held& h = chunks[op.chunk];
    const int64_t g = stage_of(op.chunk);
    switch (op.kind) {
      case OpKind::kForward:
        ++h.waiting;
        peak = std::max(peak, held());
        break;
      case OpKind::kBackward:
      case OpKind::kBackwardInput:
        // Under remat the backward first rebuilds this micro-batch's
        // activations; without it they are already counted.
        if (remat[g]) {
          peak =
              std::max(peak, held() - stages[g].input_bytes + whole(op.chunk));
        }
        --h.waiting;
        if (op.kind == OpKind::kBackwardInput) {
          ++h.deferred;
          peak = std::max(peak, held());
        }
        break;
      case OpKind::kBackwardWeight:
        --h.deferred;
        break;
      case OpKind::kOptimizerStep:
      case OpKind::kReceiveActivation:
      case OpKind::kSendActivation:
      case OpKind::kReceiveGradient:
      case OpKind::kSendGradient:
        break;
    }
  }
  return peak;
}

}  // namespace

SimulationResult Simulate(const SimulationConfig& config) {
  const int64_t m = config.micro_batches;
  const int64_t v = Interleaves(config.schedule)
                        ? std::max<int64_t>(1, config.virtual_stages)
                        : 1;
  // g stages in all, on k workers, placed as the schedule places them.
  const int64_t g_count = static_cast<int64_t>(config.stages.size());
  const int64_t k = g_count / v;
  SimulationResult result;
  result.stages.resize(k);
  if (k == 0 || m < 1 || k * v != g_count) {
    result.complete = k * v == g_count;
    return result;
  }

  std::vector<std::vector<Op>> ops = config.ops;
  if (static_cast<int64_t>(ops.size()) != k) {
    const std::vector<PhaseTicks> ticks =
        config.schedule != ScheduleKind::kZeroBubbleV
            ? std::vector<PhaseTicks>()
        : !config.order_ticks.empty()
            ? config.order_ticks
            : ScheduleTicks(config.stages, config.remat);
    ops = MakeWorkerSchedules(config.schedule, k, m, v, ticks);
  }
  // The runtime's lists: every transfer an action (hand-made lists may
  // have theirs already).
  const ScheduleKind kind = config.schedule;
  for (int64_t w = 0; w < k; ++w) ops[w] = WithTransfers(ops[w], kind, k, v, w);
  std::vector<bool> remat(g_count);
  for (int64_t g = 0; g < g_count; ++g)
    remat[g] = StageRematerializes(config.remat, g, g_count);
  // Links deliver in the order they were sent, as the real ones do:
  // to_next[g] holds what stage g sent to g+1 (activations), to_prev[g] what
  // stage g+1 sent to g (gradients), each as (micro-batch, arrival), and
  // taken[g] how many of each the receiver has consumed. A receive whose
  // micro-batch is not the next one sent never runs.
  struct Message {
    int64_t micro_batch;
    double arrival;
  };
  std::vector<std::vector<Message>> to_next(g_count), to_prev(g_count);
  std::vector<size_t> taken_next(g_count, 0), taken_prev(g_count, 0);
  // Per (stage, micro-batch): when its forward and its input half ended
  // (a weight half needs its input half, the last stage's backward its
  // forward), whether a receive holds its activation or gradient for the
  // op it serves, and whether an op made its output or input gradient for
  // a send. Every step of a stage's record is in these, so an action
  // whose operand nobody made never runs and the step is incomplete.
  std::vector<double> forward_done(g_count * m, kUnknown);
  std::vector<double> input_done(g_count * m, kUnknown);
  std::vector<char> has_activation(g_count * m, 0),
      has_gradient(g_count * m, 0);
  std::vector<char> made_activation(g_count * m, 0),
      made_gradient(g_count * m, 0);
  std::vector<size_t> next(k, 0);
  std::vector<double> free_at(k, 0);
  // One transfer at a time per direction of each link: down_link[g] carries
  // g -> g+1 activations, up_link[g] carries g -> g-1 gradients.
  std::vector<double> down_link(g_count, 0), up_link(g_count, 0);
  const double latency = config.link_latency_seconds;
  const auto transfer = [&](std::vector<double>& link, int64_t g, double sent,
                            int64_t bytes) {
    const double start = std::max(sent, link[g]);
    link[g] = start + static_cast<double>(bytes) / config.link_bytes_per_second;
    return link[g] + latency + config.message_seconds;
  };
  const auto copy = [&](int64_t bytes) {
    return config.copy_bytes_per_second > 0
               ? static_cast<double>(bytes) / config.copy_bytes_per_second
               : 0.0;
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

  // Each worker runs ops until one waits for a neighbour; a send wakes the
  // worker it feeds. An op's start time depends only on its worker's
  // previous op and its input's arrival, so this order of evaluation gives
  // the same times as processing events in time order, with O(1) work per
  // op. An action that cannot run now stops its worker until a send wakes
  // it; one that never can (its operand was never made or received, a
  // transfer over a link the stage does not have) leaves it stuck.
  std::vector<int64_t> runnable(k);
  for (int64_t w = 0; w < k; ++w) runnable[w] = k - 1 - w;
  while (!runnable.empty()) {
    const int64_t w = runnable.back();
    runnable.pop_back();
    StageSimulation& sim = result.stages[w];
    while (next[w] < ops[w].size()) {
      const Op& op = ops[w][next[w]];
      if (op.kind == OpKind::kOptimizerStep) {
        ++next[w];
        continue;
      }
      const int64_t i = op.micro_batch;
      if (i < 0 || i >= m || op.chunk < 0 || op.chunk >= v) break;  // never
      const int64_t g = StageOfChunk(kind, k, w, op.chunk);
      const int64_t at = g * m + i;
      const bool first = g == 0, last = g == g_count - 1;
      const StageCost& cost = config.stages[g];
      if (op.kind == OpKind::kReceiveActivation ||
          op.kind == OpKind::kReceiveGradient) {
        const bool activation = op.kind == OpKind::kReceiveActivation;
        if (activation ? first : last) break;  // no such link: never
        char& held = activation ? has_activation[at] : has_gradient[at];
        if (held) break;  // a second one before the first was used: never
        const double arrival =
            activation ? receive(to_next[g - 1], taken_next[g - 1], i)
                       : receive(to_prev[g], taken_prev[g], i);
        if (arrival < 0) break;  // a neighbour will wake this worker, or none
        // A receive blocks: the worker waits for the arrival.
        free_at[w] = std::max(free_at[w], arrival) +
                     copy(activation ? config.stages[g - 1].output_bytes
                                     : cost.output_bytes);
        if (activation) {
          ++taken_next[g - 1];
        } else {
          ++taken_prev[g];
        }
        held = 1;
        ++next[w];
        continue;
      }
      if (op.kind == OpKind::kSendActivation ||
          op.kind == OpKind::kSendGradient) {
        const bool activation = op.kind == OpKind::kSendActivation;
        if (activation ? last : first) break;  // no such link: never
        char& made = activation ? made_activation[at] : made_gradient[at];
        if (!made) break;  // nothing made to send: never
        made = 0;
        std::vector<Message>& queue = activation ? to_next[g] : to_prev[g - 1];
        const int64_t to = WorkerOfStage(kind, k, activation ? g + 1 : g - 1);
        const double copied = copy(
            activation ? cost.output_bytes : config.stages[g - 1].output_bytes);
        free_at[w] += copied;
        sim.busy_seconds += copied;
        // Between two chunks of one worker the link is in process: the
        // message is there as soon as it is sent.
        queue.push_back(
            {i, to == w ? free_at[w]
                : activation
                    ? transfer(down_link, g, free_at[w], cost.output_bytes)
                    : transfer(up_link, g, free_at[w],
                               config.stages[g - 1].output_bytes)});
        if (config.sends_wait_for_link && to != w) {
          // Held until its bytes are through; the stage counts the wait in
          // the op that made the message (Timeline::RecordSend).
          const double through = activation ? down_link[g] : up_link[g];
          sim.busy_seconds += std::max(0.0, through - free_at[w]);
          free_at[w] = std::max(free_at[w], through);
        }
        result.max_link_messages =
            std::max(result.max_link_messages,
                     activation ? waiting(to_next[g], taken_next[g])
                                : waiting(to_prev[g - 1], taken_prev[g - 1]));
        runnable.push_back(to);
        ++next[w];
        continue;
      }
      const bool forward = op.kind == OpKind::kForward;
      const bool weight = op.kind == OpKind::kBackwardWeight;
      bool ready;
      if (weight) {
        ready = input_done[at] >= 0;
      } else if (forward) {
        ready = (first || has_activation[at]) && !made_activation[at];
      } else {
        // Its own forward first, on every stage.
        ready = forward_done[at] >= 0 && (last || has_gradient[at]) &&
                !made_gradient[at];
      }
      if (!ready) break;  // what it needs was never made: never
      double seconds = cost.forward_seconds;
      if (weight) {
        seconds = cost.weight_seconds;
      } else if (!forward) {
        seconds = cost.backward_seconds + (remat[g] ? cost.forward_seconds : 0);
        if (op.kind == OpKind::kBackwardInput) seconds -= cost.weight_seconds;
      }
      const double end = free_at[w] + seconds;
      free_at[w] = end;
      sim.busy_seconds += seconds;
      ++next[w];
      if (weight) {
        input_done[at] = kUnknown;  // a second W of it never runs
      } else if (forward) {
        forward_done[at] = end;
        has_activation[at] = 0;
        made_activation[at] = !last;
      } else {
        if (op.kind == OpKind::kBackwardInput) input_done[at] = end;
        has_gradient[at] = 0;
        made_gradient[at] = !first;
      }
    }
  }

  for (int64_t w = 0; w < k; ++w)
    result.complete = result.complete && next[w] == ops[w].size();
  if (result.complete) {
    // The gradient-norm exchange (see step_seconds). A worker takes its
    // chunks in order on the way down and in reverse on the way back, as
    // RunWorkerStep does; each worker's chunks are in model order, so
    // visiting stages in model order (and back) visits each worker's in
    // its own order.
    const auto hop = [&](int64_t from, int64_t to) {
      return WorkerOfStage(kind, k, from) == WorkerOfStage(kind, k, to)
                 ? 0.0
                 : latency + config.message_seconds;
    };
    double sum_arrives = 0;  // the running sum at stage g
    for (int64_t g = 0; g < g_count; ++g) {
      const int64_t w = WorkerOfStage(kind, k, g);
      // Its own squares first, then the running sum (Stage::SendGradSquares).
      free_at[w] =
          std::max(free_at[w] + config.stages[g].norm_seconds, sum_arrives);
      if (g + 1 < g_count) sum_arrives = free_at[w] + hop(g, g + 1);
    }
    double total_arrives = 0;  // the total at stage g
    for (int64_t g = g_count - 1; g >= 0; --g) {
      const int64_t w = WorkerOfStage(kind, k, g);
      // Passed on upstream before the update (Stage::FinishStep).
      free_at[w] = std::max(free_at[w], total_arrives);
      if (g > 0) total_arrives = free_at[w] + hop(g, g - 1);
      free_at[w] += config.stages[g].update_seconds;
      result.stages[w].busy_seconds += config.stages[g].update_seconds;
    }
  }
  for (int64_t w = 0; w < k; ++w)
    result.step_seconds = std::max(result.step_seconds, free_at[w]);
  // Every send matched by a receive: nothing left on a link.
  for (int64_t g = 0; g < g_count; ++g) {
    result.complete = result.complete && taken_next[g] == to_next[g].size() &&
                      taken_prev[g] == to_prev[g].size();
  }
  for (int64_t w = 0; w < k; ++w) {
    StageSimulation& sim = result.stages[w];
    sim.bubble_fraction =
        result.step_seconds > 0
            ? (result.step_seconds - sim.busy_seconds) / result.step_seconds
            : 0;
    sim.peak_activation_bytes =
        PeakActivationBytes(ops[w], config.stages, remat, kind, k, w);
  }
  return result;
}

double TheoreticalBubble(ScheduleKind schedule, int64_t stages,
                         int64_t micro_batches, int64_t virtual_stages) {
  if (stages <= 1 || micro_batches <= 0) return 0.0;
  const int64_t v =
      Interleaves(schedule) ? ChunksPerWorker(schedule, virtual_stages) : 1;
  SimulationConfig config;
  StageCost unit;
  unit.forward_seconds = 1.0 / v;
  unit.backward_seconds = 2.0 / v;
  unit.weight_seconds = 1.0 / v;
  config.stages.assign(stages * v, unit);
  config.micro_batches = micro_batches;
  config.schedule = schedule;
  config.virtual_stages = v;
  config.link_bytes_per_second = 1;  // nothing is sent: no bytes
  const SimulationResult r = Simulate(config);
  // A shape the schedule does not take (interleaving with M not a multiple
  // of K) has no figure.
  if (!r.complete || !(r.step_seconds > 0)) return 0.0;
  return r.stages[0].bubble_fraction;
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
      // the forward; the model's first layer computes no input gradient,
      // so its stage does one forward of it less.
      c.backward_seconds += (InputGradUsed(l) ? 2 : 1) * f;
      // Layers that defer a weight gradient (their GEMMs'); the norms do
      // theirs in the input half, and so does attention its products of
      // activations (LayerCost::weight_flops).
      if (cost.deferred_bytes > 0) {
        c.weight_seconds +=
            cost.forward_flops > 0
                ? f * std::min(1.0, cost.weight_flops / cost.forward_flops)
                : f;
      }
      c.internal_bytes += cost.activation_bytes * micro_batch_size;
      c.deferred_bytes += cost.deferred_bytes * micro_batch_size;
    }
    c.input_bytes = shapes.inputs[begin].numel() * 4 * micro_batch_size;
    c.output_bytes = shapes.outputs[end - 1].numel() * 4 * micro_batch_size;
    begin = end;
  }
  return stages;
}

std::vector<PhaseTicks> ScheduleTicks(const std::vector<StageCost>& stages,
                                      RematMode remat) {
  const int64_t g_count = static_cast<int64_t>(stages.size());
  std::vector<double> f(g_count), b(g_count), w(g_count);
  double longest = 0;
  for (int64_t g = 0; g < g_count; ++g) {
    const StageCost& c = stages[g];
    f[g] = c.forward_seconds;
    w[g] = c.weight_seconds;
    b[g] = std::max(0.0, c.backward_seconds - c.weight_seconds) +
           (StageRematerializes(remat, g, g_count) ? c.forward_seconds : 0);
    longest = std::max({longest, f[g], b[g], w[g]});
  }
  const auto tick = [&](double x) {
    return longest > 0 ? std::max<int64_t>(1, std::llround(1000 * x / longest))
                       : int64_t{1};
  };
  std::vector<PhaseTicks> ticks(g_count);
  for (int64_t g = 0; g < g_count; ++g)
    ticks[g] = PhaseTicks{tick(f[g]), tick(b[g]), tick(w[g])};
  return ticks;
}

std::vector<PhaseTicks> CostModelTicks(const ModelShapes& shapes,
                                       const std::vector<int64_t>& balance,
                                       RematMode remat) {
  return ScheduleTicks(
      StageCostsFromLayers(shapes, CostModelLayerCosts(shapes), balance, 1),
      remat);
}

SimulationResult CostModelSimulation(
    const ModelShapes& shapes, const std::vector<int64_t>& balance,
    int64_t micro_batches, ScheduleKind schedule, int64_t virtual_stages,
    RematMode remat, int64_t batch_size, double update_traffic) {
  // A nominal machine: what matters is the ratio of compute to the update's
  // memory traffic and to each op's fixed cost (10 FLOP a byte, 5 us a
  // layer op at 100 GFLOP/s), not the machine the choice is made on, so
  // that every controller makes the same one.
  constexpr double kFlops = 1e11, kBytesPerSecond = 1e10, kLayerOp = 5e-6;
  const int64_t m = std::max<int64_t>(1, micro_batches);
  const double mb =
      static_cast<double>(std::max<int64_t>(1, (batch_size + m - 1) / m));
  std::vector<double> seconds = CostModelLayerCosts(shapes);
  for (double& x : seconds) x = x * mb / kFlops;
  SimulationConfig config;
  config.stages = StageCostsFromLayers(shapes, seconds, balance, 1);
  int64_t begin = 0;
  for (size_t g = 0; g < balance.size(); ++g) {
    StageCost& c = config.stages[g];
    for (int64_t l = begin; l < begin + balance[g]; ++l) {
      const LayerCost& cost = shapes.costs[l];
      c.forward_seconds += kLayerOp;
      c.backward_seconds += kLayerOp;
      c.update_seconds +=
          (update_traffic * cost.param_bytes + 1.5 * cost.packed_weight_bytes) /
          kBytesPerSecond;
    }
    begin += balance[g];
  }
  config.micro_batches = m;
  config.schedule = schedule;
  config.virtual_stages = virtual_stages;
  config.remat = remat;
  config.link_bytes_per_second = 1e18;
  return Simulate(config);
}

std::vector<double> CutBubbles(const gpipe::v1::JobSpec& spec,
                               ScheduleKind kind, RematMode remat,
                               const std::vector<int64_t>& balance, int64_t m,
                               int64_t v, int64_t batch) {
  const absl::StatusOr<ModelShapes> shapes = InferModelShapes(spec.model());
  int64_t layers = 0;
  for (int64_t n : balance) {
    if (n < 1) return {};
    layers += n;
  }
  if (!shapes.ok() || balance.empty() || m < 1 || v < 1 ||
      layers != static_cast<int64_t>(shapes->costs.size()) ||
      balance.size() % v != 0 ||
      !ScheduleShapeError(kind, balance.size() / v, m, v).empty()) {
    return {};
  }
  const SimulationResult r =
      CostModelSimulation(*shapes, balance, m, kind, v, remat, batch,
                          UpdateTraffic(spec.optimizer()));
  return WorkerBubbles(r);
}

std::vector<double> WorkerBubbles(const SimulationResult& r) {
  if (!r.complete) return {};
  std::vector<double> bubbles;
  for (const StageSimulation& w : r.stages)
    bubbles.push_back(w.bubble_fraction);
  return bubbles;
}

double CostModelStepSeconds(const ModelShapes& shapes,
                            const std::vector<int64_t>& balance,
                            int64_t micro_batches, ScheduleKind schedule,
                            int64_t virtual_stages, RematMode remat,
                            int64_t batch_size, double update_traffic) {
  const SimulationResult r =
      CostModelSimulation(shapes, balance, micro_batches, schedule,
                          virtual_stages, remat, batch_size, update_traffic);
  return r.complete ? r.step_seconds : std::numeric_limits<double>::infinity();
}

double UpdateTraffic(const gpipe::v1::OptimizerSpec& spec) {
  const double state = spec.has_adamw() ? 2 : spec.sgd().momentum() > 0 ? 1 : 0;
  return 4 + 2 * state;
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
