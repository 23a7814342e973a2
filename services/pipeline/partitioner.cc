#include "services/pipeline/partitioner.h"

#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/simulator.h"

namespace gpipe {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

absl::Status CheckStageCount(int64_t stages, int64_t layers) {
  if (stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages: must be >= 1, got ", stages));
  }
  if (stages > layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("stages: ", stages, " is more than the model's ", layers,
                     " layers (every stage needs at least one layer)"));
  }
  return absl::OkStatus();
}

// The exact min-max cut of layers [0, n) into `stages` non-empty runs, where
// cost(k, j, i) is stage k's cost for layers [j, i) (0-based k) and never
// decreases as the run grows; among the optimal cuts, the smallest sum of
// squared stage costs. Both passes compute every cost by the same call, so
// the bound found by the first is met bit for bit by the second.
template <typename Cost>
absl::StatusOr<std::vector<int64_t>> MinMaxCut(int64_t n, int64_t k_stages,
                                               const Cost& cost) {
  const auto at = [n](int64_t k, int64_t i) { return k * (n + 1) + i; };

  // The states a cut with no stage over `limit` can pass through: its first
  // k stages end between lo[k] and hi[k]. hi[k] is as far as k stages get
  // from the front taking as many layers each as the limit allows, lo[k] as
  // far back as the last K - k get from the end; with costs that grow with
  // the range, no such cut gets further either way (a stage may take no
  // layer here, which only widens the window). The other states can join
  // no such cut: leaving them out changes no value that matters and no cut
  // chosen. On a model of thousands of layers they were most of `gpipectl
  // plan`.
  std::vector<int64_t> lo(k_stages + 1), hi(k_stages + 1);
  const auto window = [&](double limit) {
    hi[0] = 0;
    for (int64_t k = 1; k <= k_stages; ++k) {
      int64_t e = hi[k - 1];
      while (e < n && cost(k - 1, hi[k - 1], e + 1) <= limit) ++e;
      hi[k] = e;
    }
    lo[k_stages] = n;
    for (int64_t k = k_stages - 1; k >= 0; --k) {
      int64_t j = lo[k + 1];
      while (j - 1 >= k && cost(k, j - 1, lo[k + 1]) <= limit) --j;
      lo[k] = k == 0 ? 0 : j;
    }
  };

  // Pass 1: best[k][i] = the smallest possible most-expensive stage when the
  // first i layers form k non-empty stages. best[k-1][j] never decreases with
  // j while the last stage (j, i] only shrinks, so scanning j downwards can
  // stop at the first j where the last stage dominates. Only cuts no worse
  // than one known beforehand (the layers dealt out evenly) are followed:
  // the best is among them, and the states and stages of the others are
  // left out (at infinity).
  double known = 0;
  for (int64_t k = 0, begin = 0; k < k_stages; ++k) {
    const int64_t end = n * (k + 1) / k_stages;
    known = std::max(known, cost(k, begin, end));
    begin = end;
  }
  window(known);
  std::vector<double> best((k_stages + 1) * (n + 1), kInf);
  for (int64_t i = std::max<int64_t>(1, lo[1]); i <= hi[1]; ++i) {
    best[at(1, i)] = cost(0, 0, i);
  }
  for (int64_t k = 2; k <= k_stages; ++k) {
    for (int64_t i = std::max(k, lo[k]); i <= hi[k]; ++i) {
      double b = kInf;
      for (int64_t j = std::min(i - 1, hi[k - 1]);
           j >= std::max(k - 1, lo[k - 1]); --j) {
        const double last = cost(k - 1, j, i);
        if (last > known) break;
        const double before = best[at(k - 1, j)];
        b = std::min(b, std::max(before, last));
        if (last >= before) break;
      }
      best[at(k, i)] = b;
    }
  }
  const double bound = best[at(k_stages, n)];

  // Pass 2: among the splits whose every stage costs <= bound, the smallest
  // sum of squared stage costs. K and the total are fixed, so this is the
  // smallest variance. The scans go from the largest j down, so ties keep
  // the cut with the longest last stages.
  window(bound);
  std::vector<double> squares((k_stages + 1) * (n + 1), kInf);
  std::vector<int64_t> cut((k_stages + 1) * (n + 1), -1);
  for (int64_t i = std::max<int64_t>(1, lo[1]); i <= hi[1]; ++i) {
    const double first = cost(0, 0, i);
    if (first <= bound) {
      squares[at(1, i)] = first * first;
      cut[at(1, i)] = 0;
    }
  }
  for (int64_t k = 2; k <= k_stages; ++k) {
    for (int64_t i = std::max(k, lo[k]); i <= hi[k]; ++i) {
      for (int64_t j = std::min(i - 1, hi[k - 1]);
           j >= std::max(k - 1, lo[k - 1]); --j) {
        const double last = cost(k - 1, j, i);
        if (last > bound) break;  // only grows as j decreases
        const double before = squares[at(k - 1, j)];
        if (before == kInf) continue;
        const double s = before + last * last;
        if (s < squares[at(k, i)]) {
          squares[at(k, i)] = s;
          cut[at(k, i)] = j;
        }
      }
    }
  }

  std::vector<int64_t> balance(k_stages);
  int64_t i = n;
  for (int64_t k = k_stages; k >= 1; --k) {
    const int64_t j = cut[at(k, i)];
    if (j < 0) {
      // Unreachable: pass 1's optimal split itself satisfies the bound.
      return absl::InternalError("partitioner: no split meets its own bound");
    }
    balance[k - 1] = i - j;
    i = j;
  }
  return balance;
}

// ZB-V runs chunks g and 2K-1-g on worker g (`balance` has 2K chunks), so
// a cut even over the chunks can leave one worker a chunk's worth more
// than another: 7 equal layers in chunks of 2, 2, 2, 1 give workers 3 and
// 4, where 2, 2, 1, 2 give 4 and 3 with the lighter first layer on the
// busier one. The cut kept is the one with the least busy busiest worker,
// then the least busy busiest chunk (each within 1%), then the least sum of
// the workers' squared costs: over every cut where there are few enough (up to
// kExhaustiveCuts), else from the chunks' min-max cut, moving one boundary
// at a time to wherever it lowers those most, until no move does.
constexpr int64_t kExhaustiveCuts = 200000;

template <typename Cost>
std::vector<int64_t> BalanceWorkersOfV(std::vector<int64_t> balance,
                                       const Cost& cost) {
  const int64_t chunks = static_cast<int64_t>(balance.size());
  if (chunks < 4 || chunks % 2 != 0) return balance;
  const int64_t k = chunks / 2;
  int64_t layers = 0;
  for (int64_t b : balance) layers += b;
  // Within 1% the workers count as even (a ReLU's cost more or less must
  // not buy a chunk twice the others), and so do the chunks.
  struct Score {
    double worker, chunk, squares;
    bool operator<(const Score& o) const {
      if (std::abs(worker - o.worker) > 0.01 * std::max(worker, o.worker))
        return worker < o.worker;
      if (std::abs(chunk - o.chunk) > 0.01 * std::max(chunk, o.chunk))
        return chunk < o.chunk;
      return squares < o.squares;
    }
  };
  std::vector<double> c(chunks);
  const auto score = [&](const std::vector<int64_t>& b) {
    int64_t begin = 0;
    for (int64_t g = 0; g < chunks; ++g) {
      c[g] = cost(g, begin, begin + b[g]);
      begin += b[g];
    }
    Score s{0, 0, 0};
    for (int64_t w = 0; w < k; ++w) {
      const double load = c[w] + c[chunks - 1 - w];
      s.worker = std::max(s.worker, load);
      s.squares += load * load;
    }
    s.chunk = *std::max_element(c.begin(), c.end());
    return s;
  };
  Score best = score(balance);
  // C(layers - 1, chunks - 1) cuts, counted until it passes the limit.
  double cuts = 1;
  for (int64_t i = 1; i < chunks && cuts <= kExhaustiveCuts; ++i)
    cuts = cuts * static_cast<double>(layers - i) / static_cast<double>(i);
  if (cuts <= kExhaustiveCuts) {
    std::vector<int64_t> b(chunks, 1);
    // Every composition of `layers` into `chunks` positive parts.
    const std::function<void(int64_t, int64_t)> walk = [&](int64_t g,
                                                           int64_t left) {
      if (g + 1 == chunks) {
        b[g] = left;
        const Score s = score(b);
        if (s < best) {
          best = s;
          balance = b;
        }
        return;
      }
      for (int64_t n = 1; n <= left - (chunks - 1 - g); ++n) {
        b[g] = n;
        walk(g + 1, left - n);
      }
    };
    walk(0, layers);
    return balance;
  }
  // The score's 1% tolerance makes it no strict order (a beats b, b beats
  // c, c beats a can all hold), so the climb can come back to a cut it
  // left: it stops there, and after a bounded number of rounds (each
  // moves one boundary by at least a layer). A 163-layer model looped
  // here for good, in the controller's submit too.
  std::set<std::vector<int64_t>> visited = {balance};
  const int64_t max_rounds = 4 * layers + 16;
  for (bool moved = true;
       moved && static_cast<int64_t>(visited.size()) <= max_rounds;) {
    moved = false;
    std::vector<int64_t> next = balance;
    for (int64_t g = 0; g + 1 < chunks; ++g) {
      // Boundary g (between chunks g and g+1) anywhere both keep a layer.
      const int64_t pair = balance[g] + balance[g + 1];
      for (int64_t n = 1; n < pair; ++n) {
        std::vector<int64_t> b = balance;
        b[g] = n;
        b[g + 1] = pair - n;
        const Score s = score(b);
        if (s < best) {
          best = s;
          next = std::move(b);
          moved = true;
        }
      }
    }
    if (moved && !visited.insert(next).second) break;
    balance = std::move(next);
  }
  return balance;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> PartitionByCost(
    const std::vector<double>& layer_costs, int64_t stages,
    const std::vector<double>& stage_weights, bool first_layer_input_half,
    bool zero_bubble_v) {
  const int64_t n = static_cast<int64_t>(layer_costs.size());
  RETURN_IF_ERROR(CheckStageCount(stages, n));
  std::vector<double> w = stage_weights;
  if (w.empty()) w.assign(static_cast<size_t>(stages), 1.0);
  if (static_cast<int64_t>(w.size()) != stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage weights: ", w.size(), " for ", stages, " stages"));
  }
  for (double x : w) {
    if (!std::isfinite(x) || x <= 0 || (first_layer_input_half && x < 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage weights: must be finite and ",
                       first_layer_input_half ? ">= 1" : "> 0", ", got ", x));
    }
  }
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const double c = layer_costs[i];
    if (!std::isfinite(c) || c < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer cost ", i, ": must be finite and >= 0, got ", c));
    }
    prefix[i + 1] = prefix[i] + c;
  }
  if (!std::isfinite(prefix[n])) {
    return absl::InvalidArgumentError("layer costs: the sum is not finite");
  }
  // A constant off every cost of the first stage, which starts at layer 0:
  // still non-decreasing as its range grows, and >= 0 with weights >= 1.
  const double saved = first_layer_input_half && n > 0 ? layer_costs[0] : 0.0;
  const auto cost = [&w, &prefix, saved](int64_t k, int64_t j, int64_t i) {
    return w[k] * (prefix[i] - prefix[j]) - (j == 0 ? saved : 0.0);
  };
  ASSIGN_OR_RETURN(std::vector<int64_t> balance, MinMaxCut(n, stages, cost));
  if (zero_bubble_v) return BalanceWorkersOfV(std::move(balance), cost);
  return balance;
}

absl::StatusOr<std::vector<int64_t>> PartitionByStageCost(
    int64_t layers, int64_t stages,
    const std::function<double(int64_t stage, int64_t begin, int64_t end)>&
        cost) {
  RETURN_IF_ERROR(CheckStageCount(stages, layers));
  return MinMaxCut(layers, stages, cost);
}

absl::StatusOr<std::vector<int64_t>> PartitionJob(
    const gpipe::v1::JobSpec& spec, int64_t stages) {
  const int64_t layers = spec.model().layers_size();
  RETURN_IF_ERROR(CheckStageCount(stages, layers));
  const auto& balance = spec.pipeline().balance();
  if (!balance.empty()) {
    if (balance.size() != stages) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline.balance: has ", balance.size(),
                       " entries but there are ", stages, " stages"));
    }
    for (int i = 0; i < balance.size(); ++i) {
      if (balance[i] <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pipeline.balance[", i, "]: must be > 0, got ", balance[i]));
      }
    }
    if (const std::string sum = BalanceSumError(balance, layers);
        !sum.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline.balance: ", sum));
    }
    return std::vector<int64_t>(balance.begin(), balance.end());
  }
  ASSIGN_OR_RETURN(ModelShapes shapes, InferModelShapes(spec.model()));
  const RematMode remat = RematFromSpec(spec.pipeline().remat());
  return PartitionForSchedule(
      spec, shapes, CostModelLayerCosts(shapes), stages,
      ScheduleFromSpec(spec.pipeline().schedule()), MicroBatchCount(spec),
      remat, RematStageWeights(remat, stages), /*first_layer_input_half=*/true);
}

absl::StatusOr<std::vector<int64_t>> PartitionForSchedule(
    const gpipe::v1::JobSpec& spec, const ModelShapes& shapes,
    const std::vector<double>& layer_costs, int64_t stages,
    ScheduleKind schedule, int64_t micro_batches, RematMode remat,
    const std::vector<double>& stage_weights, bool first_layer_input_half) {
  ASSIGN_OR_RETURN(std::vector<int64_t> chunks,
                   PartitionByCost(layer_costs, stages, stage_weights,
                                   first_layer_input_half));
  if (schedule != ScheduleKind::kZeroBubbleV || stages < 4 || stages % 2 != 0)
    return chunks;
  ASSIGN_OR_RETURN(std::vector<int64_t> workers,
                   PartitionByCost(layer_costs, stages, stage_weights,
                                   first_layer_input_half,
                                   /*zero_bubble_v=*/true));
  // Neither balance wins everywhere (the workers' sums matter, and so do
  // the chunks' for the order's fill and drain): the cost model's
  // simulation of the step chooses, the chunks' cut on a tie.
  const auto step = [&](const std::vector<int64_t>& cut) {
    return CostModelStepSeconds(shapes, cut, micro_batches, schedule, 2, remat,
                                spec.batch_size(),
                                UpdateTraffic(spec.optimizer()));
  };
  if (workers != chunks && step(workers) < step(chunks)) {
    return workers;
  }
  return chunks;
}

absl::StatusOr<std::vector<int64_t>> PartitionJobAt(
    const gpipe::v1::JobSpec& spec, int64_t stages) {
  if (stages == ChunkCount(spec) || spec.pipeline().balance().empty()) {
    return PartitionJob(spec, stages);
  }
  gpipe::v1::JobSpec cut = spec;
  cut.mutable_pipeline()->clear_balance();
  return PartitionJob(cut, stages);
}

std::vector<double> RematStageWeights(RematMode mode, int64_t stages) {
  std::vector<double> w(static_cast<size_t>(std::max<int64_t>(stages, 0)));
  for (int64_t k = 0; k < stages; ++k) {
    w[k] = StageRematerializes(mode, k, stages) ? 4.0 : 3.0;
  }
  return w;
}

std::vector<double> CostModelLayerCosts(const ModelShapes& shapes) {
  const size_t n = shapes.costs.size();
  std::vector<double> costs(n);
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    costs[i] = std::max(0.0, shapes.costs[i].forward_flops);
    total += costs[i];
  }
  // Relative to the model, so that the partition does not change with the
  // unit the costs are counted in.
  const double floor = total > 0 ? 1e-3 * total / static_cast<double>(n) : 1.0;
  for (double& c : costs) c += floor;
  return costs;
}

std::vector<int64_t> StageBegins(const std::vector<int64_t>& balance) {
  std::vector<int64_t> begins(balance.size());
  int64_t begin = 0;
  for (size_t s = 0; s < balance.size(); ++s) {
    begins[s] = begin;
    begin += balance[s];
  }
  return begins;
}

}  // namespace gpipe
