#include "controller/balancer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "services/pipeline/partitioner.h"
#include "services/pipeline/simulator.h"

namespace gpipe::controller {
namespace {

// Below this a measurement says nothing about speed (clock resolution,
// layers such as Flatten that do almost nothing).
constexpr double kMinSeconds = 1e-7;
// Alternating passes of the speed estimate: each halves the error or
// better on the chains of workers a job produces; 50 is far past settled.
constexpr int kEstimatePasses = 50;
// Worker speeds within this ratio count as equal: the order of the workers
// over the stages then stays as it is.
constexpr double kEqualSpeeds = 1.05;
// All orders of the workers over the stages are tried up to this many
// stages (720 orders, each one exact cut), while orders x layers stays
// under kMaxOrderLayers: the search runs under the controller's lock.
constexpr int64_t kMaxPermutedStages = 6;
constexpr int64_t kMaxOrderLayers = 100000;
// The simulator sees compute only, so for the running cut it predicts at
// most the measured step, which holds compute and transfers. Layer times
// adding up to more than this many steps were taken on a disturbed machine
// (preempted layers, a neighbour's burst): no cut is judged by them.
constexpr double kMaxPredictedOverMeasured = 1.5;

double SpeedOf(const CostEstimate& c, const std::string& worker) {
  auto it = c.speed.find(worker);
  return it == c.speed.end() ? 1.0 : it->second;
}

}  // namespace

void LayerCostBook::Record(const std::string& worker, int64_t layer_begin,
                           const std::vector<LayerSeconds>& layers,
                           double probe_gflops) {
  for (size_t i = 0; i < layers.size(); ++i) {
    seen_[{layer_begin + static_cast<int64_t>(i), worker}] = layers[i];
  }
  if (probe_gflops > 0 && std::isfinite(probe_gflops)) {
    probes_[worker] = probe_gflops;
  }
  last_report_[worker] = ++reports_;
  while (last_report_.size() > kMaxWorkers) {
    auto oldest = std::min_element(
        last_report_.begin(), last_report_.end(),
        [](const auto& a, const auto& b) { return a.second < b.second; });
    std::erase_if(
        seen_, [&](const auto& e) { return e.first.second == oldest->first; });
    probes_.erase(oldest->first);
    last_report_.erase(oldest);
  }
}

std::vector<LayerSeconds> LayerSecondsFromBusy(
    double busy_seconds, int64_t micro_batches, bool rematerializes,
    const std::vector<double>& model_costs) {
  std::vector<LayerSeconds> out(model_costs.size());
  const double sum =
      std::accumulate(model_costs.begin(), model_costs.end(), 0.0);
  if (sum <= 0 || busy_seconds <= 0 || micro_batches < 1) return out;
  // busy = M (F (1 + remat) + B) with B = 2 F.
  const double forward = busy_seconds / static_cast<double>(micro_batches) /
                         (rematerializes ? 4.0 : 3.0);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].forward = forward * model_costs[i] / sum;
    out[i].backward = 2 * out[i].forward;
    out[i].split = true;
  }
  return out;
}

void AddUpdateSeconds(double update_seconds,
                      const std::vector<int64_t>& param_bytes,
                      std::vector<LayerSeconds>& layers) {
  if (!(update_seconds > 0) || layers.empty()) return;
  const size_t n = std::min(layers.size(), param_bytes.size());
  const double total =
      std::accumulate(param_bytes.begin(), param_bytes.begin() + n, 0.0);
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i].update +=
        total > 0 ? (i < n ? update_seconds * param_bytes[i] / total : 0.0)
                  : update_seconds / static_cast<double>(layers.size());
  }
}

CostEstimate EstimateCosts(const LayerCostBook& book, int64_t layers) {
  std::vector<int64_t> classes(layers);
  std::iota(classes.begin(), classes.end(), int64_t{0});
  return EstimateCosts(book, classes);
}

CostEstimate EstimateCosts(const LayerCostBook& book,
                           const std::vector<int64_t>& layer_class) {
  const int64_t layers = static_cast<int64_t>(layer_class.size());
  int64_t timed_classes = 0;
  for (int64_t c : layer_class) timed_classes = std::max(timed_classes, c + 1);
  // A split layer is a class of its own, after the timed classes.
  const int64_t classes = timed_classes + layers;
  const auto class_of = [&](int64_t l, const LayerSeconds& s) -> int64_t {
    if (l < 0 || l >= layers) return -1;
    return s.split ? timed_classes + l : layer_class[l];
  };
  CostEstimate c;
  c.layers.assign(layers, LayerSeconds());
  std::vector<int> observed(classes, 0);
  std::vector<std::set<std::string>> seen_on(classes);
  std::vector<bool> layer_seen(layers, false);
  for (const auto& [key, s] : book.seen()) {
    const int64_t k = class_of(key.first, s);
    if (k < 0) continue;
    ++observed[k];
    seen_on[k].insert(key.second);
    layer_seen[key.first] = true;
    c.speed[key.second] = 1.0;
  }
  c.complete = std::all_of(layer_seen.begin(), layer_seen.end(),
                           [](bool b) { return b; });
  // Start from the probes' ratios (a worker without one at their geometric
  // mean); measurements that link workers then override them.
  double mean_probe_log = 0;
  for (const auto& [worker, gflops] : book.probes())
    mean_probe_log += std::log(gflops);
  if (!book.probes().empty())
    mean_probe_log /= static_cast<double>(book.probes().size());
  for (auto& [worker, speed] : c.speed) {
    auto it = book.probes().find(worker);
    speed = it == book.probes().end()
                ? 0.0
                : std::log(it->second) - mean_probe_log;  // logarithm
  }
  std::vector<LayerSeconds> cost(classes);
  for (auto& [worker, speed] : c.speed) speed = std::exp(speed);
  for (int pass = 0; pass < kEstimatePasses; ++pass) {
    // Class costs at the current speeds: the mean over what its layers
    // measured of what they would take at speed 1.
    std::vector<LayerSeconds> sum(classes);
    for (const auto& [key, s] : book.seen()) {
      const int64_t k = class_of(key.first, s);
      if (k < 0) continue;
      const double speed = c.speed[key.second];
      sum[k].forward += s.forward * speed;
      sum[k].backward += s.backward * speed;
      sum[k].update += s.update * speed;
    }
    for (int64_t k = 0; k < classes; ++k) {
      if (observed[k] == 0) continue;
      cost[k].forward = sum[k].forward / observed[k];
      cost[k].backward = sum[k].backward / observed[k];
      cost[k].update = sum[k].update / observed[k];
    }
    // Worker speeds at the current costs: a mean of log(cost / seconds)
    // weighted by seconds, so long layers, whose times are steadiest, count
    // most. Only classes seen on several workers say anything about speed
    // (a layer seen once fits any speed exactly, and would only slow the
    // passes down).
    std::map<std::string, std::pair<double, double>> logs;  // sum, weight
    for (const auto& [key, s] : book.seen()) {
      const int64_t k = class_of(key.first, s);
      if (k < 0 || seen_on[k].size() < 2) continue;
      const double total = cost[k].total();
      if (s.total() < kMinSeconds || total < kMinSeconds) continue;
      auto& [sum_log, weight] = logs[key.second];
      sum_log += s.total() * std::log(total / s.total());
      weight += s.total();
    }
    // A worker no measurement links keeps its speed. A linked group's
    // overall scale is free (costs scale with it); the update keeps it.
    for (auto& [worker, speed] : c.speed) {
      auto it = logs.find(worker);
      if (it != logs.end() && it->second.second > 0) {
        speed = std::exp(it->second.first / it->second.second);
      }
    }
  }
  // Report speeds with geometric mean 1 (costs in the same units).
  double mean_log = 0;
  for (const auto& [worker, speed] : c.speed) mean_log += std::log(speed);
  if (!c.speed.empty()) mean_log /= static_cast<double>(c.speed.size());
  const double scale = std::exp(-mean_log);
  for (auto& [worker, speed] : c.speed) speed *= scale;
  for (LayerSeconds& k : cost) {
    k.forward *= scale;
    k.backward *= scale;
    k.update *= scale;
  }
  // A layer's cost: its timed class's where that was observed, else what
  // its own split measurements say.
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t k = layer_class[l];
    c.layers[l] = k >= 0 && observed[k] > 0 ? cost[k] : cost[timed_classes + l];
  }
  return c;
}

std::vector<int64_t> LayerClasses(const gpipe::v1::ModelSpec& model,
                                  const ModelShapes& shapes) {
  std::map<std::string, int64_t> ids;
  std::vector<int64_t> classes;
  for (int i = 0; i < model.layers_size(); ++i) {
    std::string key = model.layers(i).SerializeAsString();
    if (static_cast<size_t>(i) < shapes.inputs.size()) {
      for (int64_t d : shapes.inputs[i].dims()) absl::StrAppend(&key, "|", d);
    }
    classes.push_back(
        ids.emplace(std::move(key), static_cast<int64_t>(ids.size()))
            .first->second);
  }
  return classes;
}

double WeightHalfSeconds(const LayerCost& cost, double forward,
                         double backward) {
  if (cost.deferred_bytes <= 0) return 0;
  const double share =
      cost.forward_flops > 0
          ? std::min(1.0, cost.weight_flops / cost.forward_flops)
          : 1.0;
  return std::min(forward * share, backward);
}

double PredictStepSeconds(const RebalanceInput& in,
                          const std::vector<int64_t>& balance,
                          const std::vector<std::string>& workers) {
  return SimulateCut(in, balance, workers).step_seconds;
}

SimulationResult SimulateCut(const RebalanceInput& in,
                             const std::vector<int64_t>& balance,
                             const std::vector<std::string>& workers) {
  const std::vector<double> no_seconds(in.costs.layers.size(), 0.0);
  SimulationConfig config;
  config.stages = StageCostsFromLayers(*in.shapes, no_seconds, balance,
                                       in.micro_batch_size);
  int64_t begin = 0;
  for (size_t s = 0; s < balance.size(); ++s) {
    const double speed = SpeedOf(in.costs, workers[s]);
    StageCost& stage = config.stages[s];
    stage.forward_seconds = stage.backward_seconds = stage.weight_seconds = 0;
    for (int64_t l = begin; l < begin + balance[s]; ++l) {
      stage.forward_seconds += in.costs.layers[l].forward / speed;
      stage.backward_seconds += in.costs.layers[l].backward / speed;
      stage.update_seconds += in.costs.layers[l].update / speed;
      stage.weight_seconds +=
          WeightHalfSeconds(in.shapes->costs[l], in.costs.layers[l].forward,
                            in.costs.layers[l].backward) /
          speed;
    }
    begin += balance[s];
  }
  config.micro_batches = in.micro_batches;
  config.schedule = in.schedule;
  config.virtual_stages = in.virtual_stages;
  config.remat = in.remat;
  // The order the workers would build for this cut (the controller sends
  // them the cost model's phase times).
  if (in.schedule == ScheduleKind::kZeroBubbleV)
    config.order_ticks = CostModelTicks(*in.shapes, balance, in.remat);
  return Simulate(config);
}

std::string CutKey(const std::vector<int64_t>& balance,
                   const std::vector<std::string>& workers) {
  return absl::StrCat(absl::StrJoin(balance, ","), " on ",
                      absl::StrJoin(workers, ","));
}

std::optional<RebalanceProposal> ProposeRebalance(const RebalanceInput& in,
                                                  std::string* why) {
  std::string ignored;
  if (why == nullptr) why = &ignored;
  const int64_t k = static_cast<int64_t>(in.balance.size());
  const int64_t n = static_cast<int64_t>(in.costs.layers.size());
  if (!in.costs.complete) {
    *why = "not every layer has been measured";
    return std::nullopt;
  }
  if (k < 2 || in.shapes == nullptr ||
      static_cast<int64_t>(in.workers.size()) != k ||
      std::accumulate(in.balance.begin(), in.balance.end(), int64_t{0}) != n) {
    *why = "the running cut is not one of the model's layers";
    return std::nullopt;
  }
  std::vector<double> forward(n + 1, 0.0), backward(n + 1, 0.0);
  for (int64_t l = 0; l < n; ++l) {
    forward[l + 1] = forward[l] + in.costs.layers[l].forward;
    backward[l + 1] = backward[l] + in.costs.layers[l].backward;
  }
  double slowest = 1, fastest = 1;
  std::vector<double> speeds;
  for (const std::string& w : in.workers)
    speeds.push_back(SpeedOf(in.costs, w));
  if (!speeds.empty()) {
    slowest = *std::min_element(speeds.begin(), speeds.end());
    fastest = *std::max_element(speeds.begin(), speeds.end());
  }
  const bool unequal = fastest > slowest * kEqualSpeeds;
  int64_t orders = 1;
  for (int64_t i = 2; i <= k && orders <= kMaxOrderLayers; ++i) orders *= i;
  const bool permute = unequal && k <= kMaxPermutedStages &&
                       orders * std::max<int64_t>(n, 1) <= kMaxOrderLayers;

  const double old_seconds = PredictStepSeconds(in, in.balance, in.workers);
  if (in.measured_step_seconds > 0 &&
      old_seconds > kMaxPredictedOverMeasured * in.measured_step_seconds) {
    *why = absl::StrFormat(
        "the layer times add up to %.1f ms of compute for the running cut, "
        "more than its whole %.1f ms step: they were measured on a disturbed "
        "machine, and no cut is judged by them",
        old_seconds * 1e3, in.measured_step_seconds * 1e3);
    return std::nullopt;
  }
  std::optional<RebalanceProposal> best;
  std::vector<size_t> order(k);
  std::iota(order.begin(), order.end(), size_t{0});
  do {
    std::vector<std::string> workers(k);
    for (int64_t s = 0; s < k; ++s) workers[s] = in.workers[order[s]];
    // A stage's time per micro-batch for layers [j, i) on its worker.
    absl::StatusOr<std::vector<int64_t>> cut =
        PartitionByStageCost(n, k, [&](int64_t s, int64_t j, int64_t i) {
          const double recompute =
              StageRematerializes(in.remat, s, k) ? 2.0 : 1.0;
          return (recompute * (forward[i] - forward[j]) +
                  (backward[i] - backward[j])) /
                 speeds[order[s]];
        });
    if (!cut.ok()) {
      *why = std::string(cut.status().message());
      return std::nullopt;
    }
    const double seconds = PredictStepSeconds(in, *cut, workers);
    // Strictly better only: among equals the first order tried (the
    // running one) stays.
    if (!best || seconds < best->predicted_new_seconds) {
      best = RebalanceProposal{*cut, workers, old_seconds, seconds,
                               unequal ? "worker_speeds" : "layer_costs"};
    }
  } while (permute && std::next_permutation(order.begin(), order.end()));

  const std::string cut = CutKey(best->balance, best->workers);
  const double gain = ExpectedGain(old_seconds, best->predicted_new_seconds,
                                   in.measured_step_seconds);
  if (best->balance == in.balance && best->workers == in.workers) {
    *why = absl::StrCat("the running cut ", cut, " is the best");
  } else if (gain < in.min_gain) {
    *why = absl::StrFormat(
        "the best cut %s would gain %.1f%% (min_gain %.1f%%; compute %.1f -> "
        "%.1f ms of a %.1f ms step)",
        cut, 100 * gain, 100 * in.min_gain, old_seconds * 1e3,
        best->predicted_new_seconds * 1e3, in.measured_step_seconds * 1e3);
  } else if (in.tried.contains(cut)) {
    *why = absl::StrCat("the best cut ", cut, " ran before");
  } else if (in.fits && !in.fits(best->balance, best->workers)) {
    *why = absl::StrCat("the best cut ", cut, " does not fit its workers");
  } else {
    return best;
  }
  return std::nullopt;
}

}  // namespace gpipe::controller
