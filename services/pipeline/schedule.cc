#include "services/pipeline/schedule.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpipe {

namespace {

// Stage s: K-s warm-up forwards, then for each micro-batch j its input
// half, the weight half of micro-batch j-s (once j >= s) and the next
// forward; the remaining weight halves drain at the end. With unit F, B
// and W, stage s's B(j) starts when stage s+1's B(j) has ended: the last
// stage runs F B back to back while the first stages fill the time their
// next gradient takes with W's, and in the drain the W's postponed on
// later stages fill what is bubble under 1F1B.
void ZeroBubbleH1(int64_t k, int64_t m, int64_t stage, std::vector<Op>& ops) {
  int64_t next_forward = 0, next_weight = 0;
  for (; next_forward < std::min(k - stage, m); ++next_forward)
    ops.push_back({OpKind::kForward, next_forward});
  for (int64_t j = 0; j < m; ++j) {
    ops.push_back({OpKind::kBackwardInput, j});
    if (j >= stage) ops.push_back({OpKind::kBackwardWeight, next_weight++});
    if (next_forward < m) ops.push_back({OpKind::kForward, next_forward++});
  }
  while (next_weight < m)
    ops.push_back({OpKind::kBackwardWeight, next_weight++});
}

// ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024):
// worker w holds stages w and 2K-1-w, so a micro-batch goes down the workers
// and back up, and worker 0 runs both the first and the last stage. The
// order comes from running the step on the stages' phase times (`ticks`:
// each stage's F, B and W; a transfer taking none): each worker, whenever it
// is free, takes an input half whose gradient has arrived, else a forward
// whose input has arrived (while it holds fewer than `limit` micro-batches
// between forward and weight half), else a pending weight half; the later
// chunk first at each (it is nearer the loss and so to the next backward).
// Every stage keeps its forwards, input halves and weight halves each in
// micro-batch order. With equal times this is the paper's order; with the
// real ones (input halves longer than weight halves where attention or a
// norm has no parameters) the unit-time order left workers waiting on
// inputs that came later than it assumed. Returns false when the limit
// stalls it (no worker can take anything and some op is left).
bool ZeroBubbleVOrder(int64_t k, int64_t m, int64_t limit,
                      const std::vector<PhaseTicks>& ticks,
                      std::vector<std::vector<Op>>& by_worker) {
  const int64_t stages = 2 * k;
  const auto stage_of = [k](int64_t w, int64_t c) {
    return c == 0 ? w : 2 * k - 1 - w;
  };
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  // When each (stage, micro-batch)'s forward and input half end.
  std::vector<int64_t> forward_end(stages * m, kNever),
      input_end(stages * m, kNever);
  std::vector<int64_t> next_f(stages, 0), next_b(stages, 0), next_w(stages, 0);
  std::vector<int64_t> live(k, 0), free_at(k, 0);
  by_worker.assign(k, {});
  int64_t left = 3 * stages * m;
  // Time moves from one op's end to the next: only then can a worker be
  // free or an input arrive. What a worker takes ends later, so no other
  // sees it at the same time, and the workers visited at a time are those
  // whose op just ended and those waiting (free, nothing to take) on the
  // stage of an op that just ended or a neighbouring one: only such an end
  // can make one of their ops ready. Visiting every worker at every end
  // (O(K^2 M)) took minutes of `gpipectl plan` at K=128, M=1024.
  const auto owner = [k](int64_t g) { return g < k ? g : 2 * k - 1 - g; };
  std::vector<char> waiting(k, 0);
  std::vector<int64_t> last_stage(k, -1), visit(k);
  std::iota(visit.begin(), visit.end(), 0);
  using End = std::pair<int64_t, int64_t>;  // (free_at, worker)
  std::priority_queue<End, std::vector<End>, std::greater<End>> busy;
  for (int64_t t = 0; left > 0;) {
    while (!busy.empty() && busy.top().first == t) {
      const int64_t u = busy.top().second;
      busy.pop();
      visit.push_back(u);
      for (const int64_t h : {last_stage[u] - 1, last_stage[u] + 1}) {
        if (h < 0 || h >= stages || !waiting[owner(h)]) continue;
        waiting[owner(h)] = 0;
        visit.push_back(owner(h));
      }
    }
    std::sort(visit.begin(), visit.end());
    for (const int64_t w : visit) {
      Op pick{OpKind::kOptimizerStep, -1};
      int64_t pick_stage = -1;
      // Input halves, then forwards, then weight halves; within each, the
      // earliest micro-batch, then the later chunk.
      for (int pass = 0; pass < 3 && pick_stage < 0; ++pass) {
        for (int64_t c = 1; c >= 0; --c) {
          const int64_t g = stage_of(w, c);
          int64_t j;
          bool ready;
          if (pass == 0) {
            j = next_b[g];
            ready = j < m && forward_end[g * m + j] <= t &&
                    (g == stages - 1 || input_end[(g + 1) * m + j] <= t);
          } else if (pass == 1) {
            j = next_f[g];
            ready = j < m && live[w] < limit &&
                    (g == 0 || forward_end[(g - 1) * m + j] <= t);
          } else {
            j = next_w[g];
            ready = j < next_b[g] && input_end[g * m + j] <= t;
          }
          if (ready && (pick_stage < 0 || j < pick.micro_batch)) {
            pick = Op{pass == 0   ? OpKind::kBackwardInput
                      : pass == 1 ? OpKind::kForward
                                  : OpKind::kBackwardWeight,
                      j, c};
            pick_stage = g;
          }
        }
      }
      if (pick_stage < 0) {
        waiting[w] = 1;
        continue;
      }
      const int64_t at = pick_stage * m + pick.micro_batch;
      const PhaseTicks& d = ticks[pick_stage];
      if (pick.kind == OpKind::kForward) {
        free_at[w] = t + d.forward;
        forward_end[at] = free_at[w];
        ++next_f[pick_stage];
        ++live[w];
      } else if (pick.kind == OpKind::kBackwardInput) {
        free_at[w] = t + d.input;
        input_end[at] = free_at[w];
        ++next_b[pick_stage];
      } else {
        free_at[w] = t + d.weight;
        ++next_w[pick_stage];
        --live[w];
      }
      by_worker[w].push_back(pick);
      --left;
      last_stage[w] = pick_stage;
      busy.emplace(free_at[w], w);  // phase times are at least a tick
    }
    visit.clear();
    // The next end of an op; none (every worker waiting with ops left):
    // the limit stalled it.
    if (left == 0) break;
    if (busy.empty()) return false;
    t = busy.top().first;
  }
  return true;
}

// How long the order `by_worker` takes on the stages' phase times with free
// transfers: each worker runs its ops in their order, each once its worker
// is free and its inputs are there (a forward after the stage before's, an
// input half after its own forward and the stage after's input half, a
// weight half after its input half).
int64_t OrderTicks(int64_t k, int64_t m, const std::vector<PhaseTicks>& ticks,
                   const std::vector<std::vector<Op>>& by_worker) {
  const int64_t stages = 2 * k;
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> forward_end(stages * m, kNever),
      input_end(stages * m, kNever), free_at(k, 0);
  std::vector<size_t> next(k, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t w = 0; w < k; ++w) {
      for (; next[w] < by_worker[w].size(); ++next[w]) {
        const Op& op = by_worker[w][next[w]];
        const int64_t g = op.chunk == 0 ? w : stages - 1 - w;
        const int64_t at = g * m + op.micro_batch;
        int64_t ready;
        if (op.kind == OpKind::kForward) {
          ready = g == 0 ? 0 : forward_end[at - m];
        } else if (op.kind == OpKind::kBackwardInput) {
          ready = std::max(forward_end[at],
                           g + 1 == stages ? 0 : input_end[at + m]);
        } else {
          ready = input_end[at];
        }
        if (ready == kNever) break;
        const int64_t end =
            std::max(free_at[w], ready) +
            (op.kind == OpKind::kForward         ? ticks[g].forward
             : op.kind == OpKind::kBackwardInput ? ticks[g].input
                                                 : ticks[g].weight);
        free_at[w] = end;
        if (op.kind == OpKind::kForward) forward_end[at] = end;
        if (op.kind == OpKind::kBackwardInput) input_end[at] = end;
        progress = true;
      }
    }
  }
  for (int64_t w = 0; w < k; ++w)
    if (next[w] < by_worker[w].size()) return kNever;
  return *std::max_element(free_at.begin(), free_at.end());
}

// Every worker's ZB-V ops (without the step): the order is one for all.
std::vector<std::vector<Op>> ZeroBubbleV(int64_t k, int64_t m,
                                         std::span<const PhaseTicks> ticks) {
  // Equal times unless every one of the 2K stages has its own.
  std::vector<PhaseTicks> times(2 * k);
  if (!ticks.empty() && PhaseTicksError(ticks, 2 * k).empty())
    times.assign(ticks.begin(), ticks.end());
  // 2K micro-batches of a half-size chunk: 1F1B's first stage's K of a
  // whole one. Where the phase times make the greedy order stall at that
  // limit (a worker full of micro-batches whose weight halves wait on
  // input halves that wait on it), the order for equal times keeps it
  // instead (its limit raised until it does not stall: never seen for K <=
  // 16, M <= 64).
  // And a greedy order is no optimum: where the order for equal times
  // takes no longer on the stages' times, it is kept.
  std::vector<std::vector<Op>> by_worker, paper;
  const std::vector<PhaseTicks> equal(2 * k);
  for (int64_t limit = 2 * k; !ZeroBubbleVOrder(k, m, limit, equal, paper);)
    ++limit;
  if (times == equal || !ZeroBubbleVOrder(k, m, 2 * k, times, by_worker) ||
      OrderTicks(k, m, times, by_worker) >= OrderTicks(k, m, times, paper)) {
    by_worker = std::move(paper);
  }
  return by_worker;
}

// Megatron's order: the worker's v*M (chunk, micro-batch) forwards go in
// groups of K micro-batches, chunk 0 to v-1 for each group; backwards the
// same with the chunks reversed. So each chunk sees its micro-batches in
// order 0..M-1, forwards and backwards alike. After the warm-up, one
// forward and one backward in turn; then the rest of the backwards.
void Interleaved(int64_t k, int64_t m, int64_t v, int64_t worker,
                 std::vector<Op>& ops) {
  const int64_t total = v * m;
  const auto at = [&](int64_t i, bool forward) {
    const int64_t in_group = i % (k * v);
    int64_t chunk = in_group / k;
    if (!forward) chunk = v - 1 - chunk;
    return Op{forward ? OpKind::kForward : OpKind::kBackward,
              (i / (k * v)) * k + i % k, chunk};
  };
  const int64_t warmup = std::min(total, 2 * (k - worker - 1) + (v - 1) * k);
  int64_t next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward)
    ops.push_back(at(next_forward, true));
  while (next_forward < total) {
    ops.push_back(at(next_forward++, true));
    ops.push_back(at(next_backward++, false));
  }
  while (next_backward < total) ops.push_back(at(next_backward++, false));
}

}  // namespace

bool IsTransfer(OpKind kind) {
  return kind == OpKind::kReceiveActivation ||
         kind == OpKind::kSendActivation || kind == OpKind::kReceiveGradient ||
         kind == OpKind::kSendGradient;
}

bool HasTransfers(const std::vector<Op>& ops) {
  return std::any_of(ops.begin(), ops.end(),
                     [](const Op& op) { return IsTransfer(op.kind); });
}

std::vector<Op> WithTransfers(const std::vector<Op>& ops, ScheduleKind kind,
                              int64_t k, int64_t v, int64_t worker) {
  if (HasTransfers(ops)) return ops;
  const int64_t stages = k * v;
  std::vector<Op> out;
  out.reserve(3 * ops.size());
  for (const Op& op : ops) {
    const int64_t stage = StageOfChunk(kind, k, worker, op.chunk);
    const bool first = stage == 0, last = stage == stages - 1;
    const auto with = [&](OpKind kind) {
      return Op{kind, op.micro_batch, op.chunk};
    };
    switch (op.kind) {
      case OpKind::kForward:
        if (!first) out.push_back(with(OpKind::kReceiveActivation));
        out.push_back(op);
        if (!last) out.push_back(with(OpKind::kSendActivation));
        break;
      case OpKind::kBackward:
      case OpKind::kBackwardInput:
        if (!last) out.push_back(with(OpKind::kReceiveGradient));
        out.push_back(op);
        if (!first) out.push_back(with(OpKind::kSendGradient));
        break;
      default:
        out.push_back(op);
    }
  }
  return out;
}

bool Interleaves(ScheduleKind kind) {
  return kind == ScheduleKind::kInterleaved1F1B ||
         kind == ScheduleKind::kZeroBubbleV;
}

int64_t StageOfChunk(ScheduleKind kind, int64_t k, int64_t worker,
                     int64_t chunk) {
  if (kind == ScheduleKind::kZeroBubbleV && chunk % 2 == 1)
    return (chunk + 1) * k - 1 - worker;
  return chunk * k + worker;
}

int64_t WorkerOfStage(ScheduleKind kind, int64_t k, int64_t stage) {
  if (kind == ScheduleKind::kZeroBubbleV && (stage / k) % 2 == 1)
    return k - 1 - stage % k;
  return stage % k;
}

int64_t ChunkOfStage(ScheduleKind /*kind*/, int64_t k, int64_t stage) {
  return stage / k;
}

int64_t ChunksPerWorker(ScheduleKind kind, int64_t virtual_stages) {
  if (kind == ScheduleKind::kZeroBubbleV && virtual_stages <= 1) return 2;
  // Left out, 2, as `--schedule interleaved` takes it; an explicit 1 stays
  // 1, for ScheduleShapeError to refuse.
  if (kind == ScheduleKind::kInterleaved1F1B && virtual_stages == 0) return 2;
  return std::max<int64_t>(1, virtual_stages);
}

std::string ScheduleShapeError(ScheduleKind kind, int64_t k, int64_t m,
                               int64_t v) {
  if (kind == ScheduleKind::kZeroBubbleV) {
    return v == 2 ? ""
                  : absl::StrCat(
                        "the zb-v schedule places exactly 2 virtual stages "
                        "(chunks) per worker, got ",
                        v);
  }
  if (!Interleaves(kind)) {
    return v <= 1 ? ""
                  : absl::StrCat("virtual stages: ", v,
                                 " chunks per worker "
                                 "need the interleaved schedule");
  }
  if (v < 2) {
    return absl::StrCat(
        "the interleaved schedule needs 2 or more virtual "
        "stages (chunks per worker), got ",
        v);
  }
  if (k > 1 && m % k != 0) {
    return absl::StrCat(
        "the interleaved schedule needs micro-batches to be "
        "a multiple of the ",
        k, " stages, got ", m);
  }
  return "";
}

std::string PhaseTicksError(std::span<const PhaseTicks> ticks, int64_t stages) {
  if (ticks.empty()) return "";
  if (static_cast<int64_t>(ticks.size()) != stages) {
    return absl::StrCat(ticks.size(), " stages' phase times for ", stages,
                        " stages");
  }
  for (size_t g = 0; g < ticks.size(); ++g) {
    for (const int64_t t :
         {ticks[g].forward, ticks[g].input, ticks[g].weight}) {
      if (t < 1 || t > kMaxPhaseTicks) {
        return absl::StrCat("stage ", g, "'s phase time ", t,
                            " ticks is not in [1, ", kMaxPhaseTicks, "]");
      }
    }
  }
  return "";
}

std::vector<Op> MakeWorkerSchedule(ScheduleKind kind, int64_t k, int64_t m,
                                   int64_t v, int64_t worker,
                                   std::span<const PhaseTicks> ticks) {
  if (!Interleaves(kind)) return MakeSchedule(kind, k, m, worker);
  if (v <= 1) {
    return MakeSchedule(kind == ScheduleKind::kZeroBubbleV
                            ? ScheduleKind::kZeroBubbleH1
                            : ScheduleKind::kOneFOneB,
                        k, m, worker);
  }
  if (kind == ScheduleKind::kZeroBubbleV)
    return MakeWorkerSchedules(kind, k, m, v, ticks)[worker];
  std::vector<Op> ops;
  ops.reserve(3 * v * m + 1);
  Interleaved(k, m, v, worker, ops);
  ops.push_back({OpKind::kOptimizerStep, -1});
  return ops;
}

std::vector<std::vector<Op>> MakeWorkerSchedules(
    ScheduleKind kind, int64_t k, int64_t m, int64_t v,
    std::span<const PhaseTicks> ticks) {
  if (kind != ScheduleKind::kZeroBubbleV || v <= 1) {
    std::vector<std::vector<Op>> all;
    for (int64_t w = 0; w < k; ++w)
      all.push_back(MakeWorkerSchedule(kind, k, m, v, w, ticks));
    return all;
  }
  std::vector<std::vector<Op>> all = ZeroBubbleV(k, m, ticks);
  for (std::vector<Op>& ops : all) ops.push_back({OpKind::kOptimizerStep, -1});
  return all;
}

std::vector<Op> MakeSchedule(ScheduleKind kind, int64_t k, int64_t m,
                             int64_t stage) {
  if (Interleaves(kind)) return MakeWorkerSchedule(kind, k, m, 1, stage);
  std::vector<Op> ops;
  ops.reserve(3 * m + 1);
  if (kind == ScheduleKind::kZeroBubbleH1) {
    ZeroBubbleH1(k, m, stage, ops);
  } else if (kind == ScheduleKind::kGPipe) {
    for (int64_t i = 0; i < m; ++i) ops.push_back({OpKind::kForward, i});
    for (int64_t i = 0; i < m; ++i) ops.push_back({OpKind::kBackward, i});
  } else {
    // Stage s runs K-1-s forwards ahead, then one forward and one backward
    // in turn, then drains; stage 0 thus never holds more than K.
    const int64_t warmup = std::min(k - 1 - stage, m);
    int64_t next_forward = 0, next_backward = 0;
    for (; next_forward < warmup; ++next_forward)
      ops.push_back({OpKind::kForward, next_forward});
    while (next_forward < m) {
      ops.push_back({OpKind::kForward, next_forward++});
      ops.push_back({OpKind::kBackward, next_backward++});
    }
    while (next_backward < m)
      ops.push_back({OpKind::kBackward, next_backward++});
  }
  ops.push_back({OpKind::kOptimizerStep, -1});
  return ops;
}

bool SplitsBackward(ScheduleKind kind) {
  return kind == ScheduleKind::kZeroBubbleH1 ||
         kind == ScheduleKind::kZeroBubbleV;
}

std::string_view ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::kOneFOneB:
      return "1f1b";
    case ScheduleKind::kZeroBubbleH1:
      return "zb-h1";
    case ScheduleKind::kInterleaved1F1B:
      return "interleaved";
    case ScheduleKind::kZeroBubbleV:
      return "zb-v";
  }
  return "?";
}

absl::StatusOr<ScheduleKind> ParseScheduleName(std::string_view name) {
  if (name == "gpipe" || name == "GPIPE") return ScheduleKind::kGPipe;
  if (name == "1f1b" || name == "ONE_F_ONE_B") return ScheduleKind::kOneFOneB;
  if (name == "zb-h1" || name == "ZERO_BUBBLE_H1")
    return ScheduleKind::kZeroBubbleH1;
  if (name == "interleaved" || name == "INTERLEAVED_1F1B")
    return ScheduleKind::kInterleaved1F1B;
  if (name == "zb-v" || name == "ZERO_BUBBLE_V")
    return ScheduleKind::kZeroBubbleV;
  return absl::InvalidArgumentError(
      absl::StrCat("schedule: '", std::string(name),
                   "' is not one of gpipe, 1f1b, zb-h1, interleaved, zb-v"));
}

ScheduleKind ScheduleFromSpec(gpipe::v1::Schedule schedule) {
  switch (schedule) {
    case gpipe::v1::ONE_F_ONE_B:
      return ScheduleKind::kOneFOneB;
    case gpipe::v1::ZERO_BUBBLE_H1:
      return ScheduleKind::kZeroBubbleH1;
    case gpipe::v1::INTERLEAVED_1F1B:
      return ScheduleKind::kInterleaved1F1B;
    case gpipe::v1::ZERO_BUBBLE_V:
      return ScheduleKind::kZeroBubbleV;
    default:
      return ScheduleKind::kGPipe;
  }
}

gpipe::v1::Schedule ScheduleToSpec(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return gpipe::v1::GPIPE;
    case ScheduleKind::kOneFOneB:
      return gpipe::v1::ONE_F_ONE_B;
    case ScheduleKind::kZeroBubbleH1:
      return gpipe::v1::ZERO_BUBBLE_H1;
    case ScheduleKind::kInterleaved1F1B:
      return gpipe::v1::INTERLEAVED_1F1B;
    case ScheduleKind::kZeroBubbleV:
      return gpipe::v1::ZERO_BUBBLE_V;
  }
  return gpipe::v1::GPIPE;
}

int64_t MaxLiveMicroBatches(const std::vector<Op>& ops, int64_t chunk) {
  int64_t live = 0, peak = 0;
  for (const Op& op : ops) {
    if (chunk >= 0 && op.chunk != chunk) continue;
    if (op.kind == OpKind::kForward) peak = std::max(peak, ++live);
    if (op.kind == OpKind::kBackward || op.kind == OpKind::kBackwardWeight)
      --live;
  }
  return peak;
}

int64_t MaxDeferredMicroBatches(const std::vector<Op>& ops) {
  int64_t deferred = 0, peak = 0;
  for (const Op& op : ops) {
    if (op.kind == OpKind::kBackwardInput) peak = std::max(peak, ++deferred);
    if (op.kind == OpKind::kBackwardWeight) --deferred;
  }
  return peak;
}

std::string ToString(const Op& op) {
  const std::string chunk =
      op.chunk > 0 ? absl::StrCat("/", op.chunk) : std::string();
  switch (op.kind) {
    case OpKind::kForward:
      return absl::StrCat("F", op.micro_batch, chunk);
    case OpKind::kBackward:
    case OpKind::kBackwardInput:
      return absl::StrCat("B", op.micro_batch, chunk);
    case OpKind::kBackwardWeight:
      return absl::StrCat("W", op.micro_batch, chunk);
    case OpKind::kOptimizerStep:
      return "step";
    case OpKind::kReceiveActivation:
      return absl::StrCat("ra", op.micro_batch, chunk);
    case OpKind::kSendActivation:
      return absl::StrCat("sa", op.micro_batch, chunk);
    case OpKind::kReceiveGradient:
      return absl::StrCat("rg", op.micro_batch, chunk);
    case OpKind::kSendGradient:
      return absl::StrCat("sg", op.micro_batch, chunk);
  }
  return "?";
}

}  // namespace gpipe
