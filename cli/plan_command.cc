// gpipectl plan JOB.json: which K, M, schedule and re-materialization (and,
// for a cluster of N workers, how many data-parallel replicas R) to run a
// job with. Partitions the model for each K, simulates one step of every
// combination (simulator.h) and prints the predicted throughput, bubble and
// activation memory, marking the fastest that fits a memory budget. The
// simulation is cheap, so it also answers for pipelines far larger than this
// machine.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "cli/flag_checks.h"
#include "services/core/bytes.h"
#include "services/core/cores.h"
#include "services/core/memory.h"
#include "services/core/status.h"
#include "services/nn/layer.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/gradient_tree.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/layer_profile.h"
#include "services/pipeline/memory_model.h"
#include "services/pipeline/partitioner.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/simulator.h"
#include "services/tensor/cpu/gemm.h"
#include "services/tensor/threads.h"

ABSL_FLAG(std::string, stages_range, "",
          "plan: stage counts K to consider, 'LO..HI' or 'K' (capped at the "
          "number of layers); default 1..8, growing past 8 while the best K "
          "is at its end");
ABSL_FLAG(bool, measure, false,
          "plan: balance and predict with measured per-layer times instead "
          "of the FLOP cost model");
ABSL_FLAG(std::string, memory_budget, "0",
          "plan: memory per stage (parameters, gradients, optimizer state, "
          "activations and working memory or an evaluation batch, whichever "
          "is larger, and data, as workers check it), bytes or with a unit "
          "(512MiB, 2GiB); 0: no limit");
ABSL_FLAG(double, flops, 0,
          "plan: FLOP/s of one stage for the cost model (0: measure a "
          "single-threaded sgemm here; --measure times the layers "
          "instead)");
ABSL_FLAG(double, memory_gbps, 0,
          "plan: gigabytes a second one stage moves through memory, for the "
          "cost model: a product takes at least its weight's read, an "
          "update its parameters' traffic (0: measure a single-threaded "
          "triad here; --measure times the layers instead)");
ABSL_FLAG(double, measure_under, 5,
          "plan: without --measure, time the layers anyway where the cost "
          "model puts that timing under this many seconds (0: never): the "
          "cost model is optimistic for small layers. --flops, "
          "--memory-gbps or --layer-overhead-us keep the cost model");
ABSL_FLAG(double, layer_overhead_us, -1,
          "plan: fixed microseconds per layer per forward or backward op, on "
          "top of the per-sample cost (-1: fitted from --measure, else 5)");
ABSL_FLAG(double, link_gbps, 10,
          "plan: bandwidth of each link between neighbouring stages, in "
          "gigabits per second");
ABSL_FLAG(double, message_us, 0,
          "plan: fixed microseconds each message between workers takes on "
          "top of its bytes and the link's latency (framing, system calls, "
          "waking the receiver)");
ABSL_FLAG(bool, blocking_sends, true,
          "plan: a send holds its stage until its bytes are through the "
          "link, as over gRPC between hosts (false: the shared-memory "
          "plane's ring, which takes a message at once)");
ABSL_FLAG(double, link_latency_us, 0,
          "plan: one-way latency of each link between neighbouring stages, "
          "in microseconds, paid by every message");
// Shared with `gpipectl train` (defined there). Here they narrow the plan:
// --stages K and --micro-batches M (0: consider several), --schedule and
// --remat ("": both schedules, all three modes). With one K and one M the
// plan also prints that configuration's stages.
ABSL_DECLARE_FLAG(int64_t, stages);
ABSL_DECLARE_FLAG(int64_t, micro_batches);
ABSL_DECLARE_FLAG(std::string, schedule);
ABSL_DECLARE_FLAG(std::string, remat);
// --workers N (defined by `gpipectl local`, the workers it starts): here the
// cluster's workers; with N, each K is also tried with R data-parallel
// replicas (K x R <= N; G groups, the spec's gradient_groups or else R,
// dividing M, and R <= G), their gradients summed over the links
// after each stage's last backward.
ABSL_DECLARE_FLAG(int64_t, workers);
ABSL_DECLARE_FLAG(int64_t, replicas);
ABSL_DECLARE_FLAG(int64_t, virtual_stages);

namespace gpipe::cli {

int RunPlan(const std::vector<std::string>& args);

namespace {

constexpr int kMeasureReps = 5;
// The most memory a plan times the layers in without --measure: a default
// plan was a second's work, and should not take a large host's quarter.
constexpr int64_t kMeasureMemoryCap = int64_t{4} << 30;
// How long the default range keeps doubling K while the best sits at its end.
constexpr auto kGrowthBudget = std::chrono::seconds(20);
constexpr int64_t kMaxPlannedMicroBatches = 256;
constexpr double kMiB = 1024.0 * 1024.0;
// Exit status when the spec's own configuration would be refused (1: no
// configuration fits the memory budget, or an error; 2: a usage error).
constexpr int kOwnRefusedExit = 3;
// A kernel launch or a parallel region plus dispatch: the order of what a
// layer op costs beyond its arithmetic on CPUs and GPUs alike.
constexpr double kDefaultLayerOverhead = 5e-6;

int Fail(const absl::Status& status) { return FailCommand("plan", status); }

// What timing the layers holds: the whole model and one micro-batch's
// activations, as one stage under 1F1B does.
int64_t MeasuringBytes(const gpipe::v1::JobSpec& spec,
                       const ModelShapes& shapes) {
  const std::vector<int64_t> whole = {
      static_cast<int64_t>(shapes.costs.size())};
  return EstimatePipelineMemory(spec, shapes, whole, MicroBatchCount(spec),
                                ScheduleKind::kOneFOneB, RematMode::kNever)[0]
      .total();
}

absl::StatusOr<std::pair<int64_t, int64_t>> ParseStagesRange(
    absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, "..");
  int64_t lo = 0, hi = 0;
  bool ok = false;
  if (parts.size() == 1) {
    ok = absl::SimpleAtoi(parts[0], &lo);
    hi = lo;
  } else if (parts.size() == 2) {
    ok = absl::SimpleAtoi(parts[0], &lo) && absl::SimpleAtoi(parts[1], &hi);
  }
  if (!ok || lo < 1 || hi < lo) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stages-range: expected LO..HI with 1 <= LO <= HI, got '",
        std::string(text), "'"));
  }
  return std::make_pair(lo, hi);
}

// The best of repetitions of `run` until at least kMeasureFor has passed
// (and 5 of them): on a shared machine a repetition that lost its core reads
// 2-3 times slower, and three 3 ms repetitions could all lose it (one plan
// measured 37 GFLOP/s where the next seven measured 83-86).
template <typename Run>
double BestSeconds(Run run) {
  constexpr auto kMeasureFor = std::chrono::milliseconds(200);
  const auto began = std::chrono::steady_clock::now();
  double best = 1e30;
  for (int rep = 0;
       rep < 5 || std::chrono::steady_clock::now() - began < kMeasureFor;
       ++rep) {
    const auto start = std::chrono::steady_clock::now();
    run(rep);
    best = std::min(best, std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - start)
                              .count());
  }
  return std::max(best, 1e-9);
}

// FLOP/s of one single-threaded 512^3 sgemm on this machine: the speed the
// cost model assumes for every stage when --flops is not given.
double MeasureSgemmFlops() {
  constexpr int64_t n = 512;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  cpu::Gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f, c.data());
  return 2.0 * n * n * n / BestSeconds([&](int) {
           cpu::Gemm(false, false, n, n, n, 1.0f, a.data(), b.data(), 0.0f,
                     c.data());
         });
}

// Bytes/s one thread moves through memory on this machine (reading two
// arrays and writing a third, a STREAM triad on 32 MiB, past the caches):
// the speed of the once-a-step passes over parameters, and of a product's
// read of its weight, that the cost model assumes when nothing was
// measured.
double MeasureTriadBytesPerSecond() {
  constexpr int64_t n = 8 << 20;
  std::vector<float> a(n, 0.5f), b(n, 0.25f), c(n, 0.0f);
  return 3.0 * 4 * n / BestSeconds([&](int rep) {
           for (int64_t i = 0; i < n; ++i) c[i] = a[i] + 0.5f * b[i];
           a[rep % n] = c[n - 1 - rep % n];  // keep the loop's result live
         });
}

// The seconds --measure's timing takes by the cost model at `flops`: 24
// training passes at micro-batches of `mb` samples and 12 of one sample
// (MeasureLayerPasses at both sizes, 2 x 6 passes each, and
// MeasureLayerStepSeconds, 6 x 2), each op at least the default overhead.
// Each of its three models is built and initialized first (about 5 ns a
// parameter).
double MeasuringSeconds(const ModelShapes& shapes, int64_t mb, double flops) {
  const auto pass = [&](int64_t samples) {
    double seconds = 0;
    for (const LayerCost& cost : shapes.costs)
      seconds +=
          3 * (cost.forward_flops * samples / flops + kDefaultLayerOverhead);
    return seconds;
  };
  double parameters = 0;
  for (const LayerCost& cost : shapes.costs)
    parameters += static_cast<double>(cost.param_bytes) / sizeof(float);
  return 24 * pass(mb) + 12 * pass(1) + 3 * parameters * 5e-9;
}

// Bytes each parameter's squares pass moves, in units of the parameter's
// own bytes: it reads the gradient (the update's: UpdateTraffic).
constexpr double kNormTraffic = 1;

// One simulated configuration.
struct Option {
  int64_t k = 0;
  int64_t m = 0;
  int64_t r = 1;  // data-parallel replicas, each running whole groups
  int64_t v = 1;  // chunks per stage (interleaved)
  ScheduleKind schedule = ScheduleKind::kGPipe;
  RematMode remat = RematMode::kNever;
  std::vector<int64_t> balance;  // K x v entries
  std::vector<StageCost> costs;  // per chunk
  SimulationResult sim;          // per stage (worker)
  double samples_per_second = 0;
  double min_bubble = 1;  // the busiest stage's: the pipeline's own bubble
  double max_bubble = 0;  // the idlest stage's: shows imbalance
  std::vector<StageMemory> memory;  // per chunk (memory_model.h)
  int64_t peak_bytes = 0;           // the largest stage's, its chunks'
  // The slowest stage's gradient sum across the replicas, after its last
  // backward (in the step time).
  double reduce_seconds = 0;
};

// Seconds for R replicas of a stage to sum `bytes` of gradients over links
// of `bytes_per_second` and `latency`, each message costing `message`
// more (--message-us, as between stages): each replica sends (R-1)/R of
// them in the reduce-scatter and again in the all-gather, one message per
// peer each time (LinkReduction).
double ReduceSeconds(int64_t r, int64_t bytes, double bytes_per_second,
                     double latency, double message) {
  if (r <= 1) return 0;
  const double share = static_cast<double>(r - 1) / r;
  return 2 * share * bytes / bytes_per_second +
         2 * (r - 1) * (latency + message);
}

bool Fits(const Option& o, int64_t budget) {
  return budget <= 0 || o.peak_bytes <= budget;
}

// Faster wins; at equal speed (1F1B often matches GPipe) less memory does.
bool Better(const Option& a, const Option& b) {
  const double tol =
      1e-9 * std::max(a.samples_per_second, b.samples_per_second);
  if (std::abs(a.samples_per_second - b.samples_per_second) > tol) {
    return a.samples_per_second > b.samples_per_second;
  }
  return a.peak_bytes < b.peak_bytes;
}

std::string BalanceText(const std::vector<int64_t>& balance) {
  std::string s = absl::StrJoin(balance, ",");
  if (s.size() > 24) s = s.substr(0, 21) + "...";
  return s;
}

std::string ScheduleText(const Option& o) {
  std::string name(ScheduleName(o.schedule));
  return o.v > 1 ? absl::StrCat(name, "/", o.v) : name;
}

// Samples a second with a tenth's digit, and three significant digits
// below 10: a 10B-parameter model's 0.015 read 0.0.
std::string RateText(double samples_per_second) {
  return samples_per_second >= 10 ? absl::StrFormat("%.1f", samples_per_second)
                                  : absl::StrFormat("%.3g", samples_per_second);
}

// With replicas (--workers) a column R after K, and the step includes
// the gradient sum.
std::string Row(const Option& o, const char* mark, bool replicas) {
  return absl::StrFormat(
      "%s %4d%s %5d  %-13s %-11s %10.3f %11s %5.1f%% %5.1f%% %10.2f  %s", mark,
      o.k, replicas ? absl::StrFormat(" %3d", o.r) : "", o.m, ScheduleText(o),
      std::string(RematName(o.remat)),
      (o.sim.step_seconds + o.reduce_seconds) * 1e3,
      RateText(o.samples_per_second), o.min_bubble * 100, o.max_bubble * 100,
      o.peak_bytes / kMiB, BalanceText(o.balance));
}

void PrintHeader(bool replicas) {
  std::printf(
      "     K%s     M  schedule      remat          step ms   samples/s "
      "bubble    max   peak MiB  balance\n",
      replicas ? "   R" : "");
}

// One line per stage, or per chunk (worker/chunk) when a worker holds
// several, with its worker's busy time and bubble.
void PrintStageDetails(const Option& o) {
  std::printf("\nper stage (K=%lld, M=%lld, %s, remat %s):\n",
              static_cast<long long>(o.k), static_cast<long long>(o.m),
              ScheduleText(o).c_str(), std::string(RematName(o.remat)).c_str());
  std::printf(
      "  stage  layers      forward ms  backward ms  update ms   busy ms  "
      "bubble   peak MiB  memory\n");
  const std::vector<int64_t> begins = StageBegins(o.balance);
  for (size_t s = 0; s < o.balance.size(); ++s) {
    const int64_t worker =
        WorkerOfStage(o.schedule, o.k, static_cast<int64_t>(s));
    const StageSimulation& st = o.sim.stages[worker];
    const std::string layers =
        absl::StrCat("[", begins[s], ", ", begins[s] + o.balance[s], ")");
    const std::string name =
        o.v > 1 ? absl::StrCat(
                      worker, "/",
                      ChunkOfStage(o.schedule, o.k, static_cast<int64_t>(s)))
                : absl::StrCat(s);
    std::printf("  %5s  %-10s %11.3f %12.3f %10.3f %9.3f %6.1f%% %10.2f  %s\n",
                name.c_str(), layers.c_str(), o.costs[s].forward_seconds * 1e3,
                o.costs[s].backward_seconds * 1e3,
                (o.costs[s].norm_seconds + o.costs[s].update_seconds) * 1e3,
                st.busy_seconds * 1e3, st.bubble_fraction * 100,
                o.memory[s].total() / kMiB, o.memory[s].ToString().c_str());
  }
}

}  // namespace

int RunPlan(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr,
                 "usage: gpipectl plan JOB.json [--stages-range LO..HI] "
                 "[--stages K] [--micro-batches M] [--schedule S] "
                 "[--remat R] [--measure] [--measure-under S] "
                 "[--memory-budget BYTES] "
                 "[--flops F] [--memory-gbps B] [--layer-overhead-us U] "
                 "[--link-gbps G] "
                 "[--link-latency-us L] [--message-us U] [--blocking-sends=B] "
                 "[--workers N] [--replicas R] [--virtual-stages V]\n");
    return 2;
  }
  absl::StatusOr<gpipe::v1::JobSpec> spec =
      LoadJobSpecFile(args[0], SpecCheck::kJsonOnly);
  if (!spec.ok()) return Fail(spec.status());
  // The plan chooses the stages, schedule, remat and replicas itself: the
  // spec's own choice of them need not be valid (gradient_groups 2 under
  // ZB-H1 needs 2 replicas, which the plan may pick), so they are checked
  // at their defaults. The micro-batches and gradient groups stay: the plan
  // starts from the one and keeps to the other. Where the spec's own choice
  // is not runnable, the plan says why instead of showing its row, and
  // plans from the defaults.
  std::string own_refused;
  {
    gpipe::v1::JobSpec checked = *spec;
    gpipe::v1::PipelineSpec& p = *checked.mutable_pipeline();
    const gpipe::v1::PipelineSpec own = p;
    p.clear_stages();
    p.clear_schedule();
    p.clear_remat();
    p.clear_balance();
    p.clear_min_stages();
    p.clear_virtual_stages();
    p.clear_replicas();
    p.clear_min_replicas();
    if (absl::Status s = CheckJobSpec(&checked); !s.ok()) {
      return Fail(
          absl::Status(s.code(), absl::StrCat(args[0], ": ", s.message())));
    }
    *spec = std::move(checked);  // with the sizes the data filled
    gpipe::v1::PipelineSpec defaults = spec->pipeline();
    *spec->mutable_pipeline() = own;
    if (absl::Status s = ValidateJobSpec(*spec); !s.ok()) {
      own_refused = absl::StrCat(args[0], ": ", s.message());
      *spec->mutable_pipeline() = std::move(defaults);
    }
  }
  absl::StatusOr<ModelShapes> shapes = InferModelShapes(spec->model());
  if (!shapes.ok()) return Fail(shapes.status());
  const int64_t layers = spec->model().layers_size();
  const int64_t batch = spec->batch_size();

  absl::StatusOr<std::pair<int64_t, int64_t>> range =
      ParseStagesRange(absl::GetFlag(FLAGS_stages_range).empty()
                           ? "1..8"
                           : absl::GetFlag(FLAGS_stages_range));
  if (!range.ok()) return Fail(range.status());
  int64_t k_lo = range->first, k_hi = std::min(range->second, layers);
  if (const int64_t k = absl::GetFlag(FLAGS_stages); k != 0) {
    if (k < 1 || k > layers) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--stages: ", k, " is not within 1..", layers,
                       " (the model's layers; every stage needs one)")));
    }
    // Both: which one was meant is not ours to guess (K=3 was planned for
    // --stages 3 --stages-range 1..2 without a word).
    if (!absl::GetFlag(FLAGS_stages_range).empty()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--stages: ", k, " and --stages-range ",
                       absl::GetFlag(FLAGS_stages_range),
                       " both say which K to plan; give one")));
    }
    k_lo = k_hi = k;
  }
  if (k_lo > k_hi) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--stages-range: no K in ", absl::GetFlag(FLAGS_stages_range),
        " is within the model's ", layers, " layers")));
  }
  const int64_t workers = absl::GetFlag(FLAGS_workers);
  if (workers < 0 || workers > 1 << 20) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--workers: must be in [0, 1048576] (0: one pipeline), got ",
        workers)));
  }
  // A stage is a worker: no K past them (the spec's own row aside).
  if (workers > 0 && k_lo > workers) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--workers: ", workers, " workers cannot hold K=", k_lo,
                     " stages (a stage is a worker)")));
  }
  if (workers > 0) k_hi = std::min(k_hi, workers);

  // Batch norm normalizes each micro-batch by its own statistics: another
  // M trains another model (a CNN's test loss after 10 steps was 0.99 at
  // M=1 and 1.56 at M=4), so the plan keeps the spec's M unless asked.
  bool batch_norm = false;
  for (const gpipe::v1::LayerSpec& layer : spec->model().layers())
    batch_norm = batch_norm || layer.has_batch_norm();
  std::vector<int64_t> micro_batches;
  if (batch_norm && absl::GetFlag(FLAGS_micro_batches) == 0) {
    micro_batches.push_back(std::min(MicroBatchCount(*spec), batch));
  } else if (const int64_t m = absl::GetFlag(FLAGS_micro_batches); m != 0) {
    if (m < 1 || m > batch) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--micro-batches: ", m, " is not within 1..", batch,
                       " (the batch size)")));
    }
    micro_batches.push_back(m);
  } else {
    for (int64_t m = 1; m <= std::min(batch, kMaxPlannedMicroBatches); m *= 2)
      micro_batches.push_back(m);
    micro_batches.push_back(std::min(MicroBatchCount(*spec), batch));
    std::sort(micro_batches.begin(), micro_batches.end());
    micro_batches.erase(std::unique(micro_batches.begin(), micro_batches.end()),
                        micro_batches.end());
  }

  // Interleaved with the spec's chunks per stage, or 2, where M is a
  // multiple of K; ZB-V with its 2.
  std::vector<ScheduleKind> schedules = {
      ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
      ScheduleKind::kZeroBubbleH1, ScheduleKind::kInterleaved1F1B,
      ScheduleKind::kZeroBubbleV};
  if (const std::string name = absl::GetFlag(FLAGS_schedule); !name.empty()) {
    absl::StatusOr<ScheduleKind> kind = ParseScheduleName(name);
    if (!kind.ok()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--", kind.status().message())));
    }
    schedules = {*kind};
  }
  std::vector<RematMode> remats = {RematMode::kNever, RematMode::kExceptLast,
                                   RematMode::kAlways};
  if (const std::string name = absl::GetFlag(FLAGS_remat); !name.empty()) {
    absl::StatusOr<RematMode> mode = ParseRematName(name);
    if (!mode.ok()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--", mode.status().message())));
    }
    remats = {*mode};
  }

  absl::StatusOr<int64_t> budget =
      ParseBytes(absl::GetFlag(FLAGS_memory_budget), "--memory-budget");
  if (!budget.ok()) return Fail(budget.status());
  const double link_gbps = absl::GetFlag(FLAGS_link_gbps);
  // Finite, as --flops must be: an infinite link is no link the simulator
  // can time (0 s for every transfer reads as a measurement).
  if (!(link_gbps > 0) || !std::isfinite(link_gbps) || link_gbps > 1e7) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--link-gbps: must be in (0, 1e7] Gb/s, got ", link_gbps)));
  }
  const bool blocking_sends = absl::GetFlag(FLAGS_blocking_sends);
  const double message_us = absl::GetFlag(FLAGS_message_us);
  if (!(message_us >= 0) || message_us > 1e7) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--message-us: must be in [0, 1e7], got ", message_us)));
  }
  const double link_latency_us = absl::GetFlag(FLAGS_link_latency_us);
  if (!(link_latency_us >= 0) || link_latency_us > 1e7) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--link-latency-us: must be in [0, 1e7], got ", link_latency_us)));
  }

  const int64_t pinned_replicas = absl::GetFlag(FLAGS_replicas);
  if (pinned_replicas < 0 || pinned_replicas > kMaxReplicas) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--replicas: must be in [0, ", kMaxReplicas,
                     "] (0: the plan tries them), got ", pinned_replicas)));
  }
  const bool with_replicas = workers > 0 || pinned_replicas > 0;
  const int64_t pinned_groups = spec->pipeline().gradient_groups();
  // Whether R replicas of (K, M, schedule) run, by the spec's own rules
  // (ValidateReplicas): G groups (the spec's, or R) divide M, each replica
  // runs whole groups (R <= G), one replica under an interleaved schedule,
  // and no more groups than replicas where the backward splits; and K x R
  // fits the workers. R = 1 too: the plan recommended ZB-H1 rows that
  // gradient_groups 4 makes refuse to run.
  const auto replicas_run = [&](int64_t k, int64_t m, int64_t r,
                                ScheduleKind schedule) {
    const int64_t g = pinned_groups > 0 ? pinned_groups : r;
    if (m % g != 0 || r > g) return false;
    if (workers > 0 && k * r > workers) return false;
    if (r > 1 && Interleaves(schedule)) return false;
    if (g > r && SplitsBackward(schedule)) return false;
    return true;
  };
  // The replica counts to try: --replicas alone, or every R that runs (6
  // workers run K=2 with 3 replicas where M allows it).
  const auto replica_choices = [&](int64_t k, int64_t m,
                                   ScheduleKind schedule) {
    std::vector<int64_t> out;
    if (pinned_replicas > 0) {
      if (replicas_run(k, m, pinned_replicas, schedule))
        out.push_back(pinned_replicas);
      return out;
    }
    for (int64_t r = 1; r <= (workers > 0 ? kMaxReplicas : 1); ++r) {
      if (replicas_run(k, m, r, schedule)) out.push_back(r);
    }
    return out;
  };

  // One core per stage: a stage is one worker, and on a small machine
  // several workers share the cores.
  SetComputeThreads(1);
  // Layer l costs, per forward op on a micro-batch of mb samples,
  // forward_fixed[l] + forward_per_sample[l] * mb, and per backward op the
  // same with backward_*. The fixed part (kernel launches, dispatch, reading
  // a weight once whatever the micro-batch) is what makes tiny micro-batches
  // slow.
  std::vector<double> forward_per_sample(layers), backward_per_sample(layers);
  std::vector<double> forward_fixed(layers), backward_fixed(layers);
  // The weight half of a split backward, where measured (empty otherwise:
  // the cost model's estimate in stage_costs below).
  std::vector<double> weight_per_sample, weight_fixed;
  std::vector<double> partition_costs(layers);  // what PartitionByCost sees
  // Once a step per layer: the gradient squares and the update
  // (StageCost::norm_seconds, update_seconds).
  std::vector<double> norm(layers, 0), update(layers, 0);
  // The cost model's (empty when measured): the seconds a layer's product
  // takes to read its weight from memory once. A product is the longer of
  // that and its arithmetic, so a micro-batch of a few samples costs what
  // its weights' traffic costs, however few its FLOPs: a plan by FLOPs
  // alone put the deep MLP's 128 micro-batches of one sample at 42 ms a
  // step against 242 ms measured, and ranked the most micro-batches best.
  std::vector<double> weight_read;
  std::string cost_source;
  const double overhead_flag = absl::GetFlag(FLAGS_layer_overhead_us) * 1e-6;
  const int64_t spec_mb = (batch + MicroBatchCount(*spec) - 1) /
                          std::max<int64_t>(1, MicroBatchCount(*spec));
  const double measure_under = absl::GetFlag(FLAGS_measure_under);
  bool measured = absl::GetFlag(FLAGS_measure);
  // The sgemm rate of the cost model, when nothing is timed.
  double flops = absl::GetFlag(FLAGS_flops);
  std::string flops_how = "given";
  // Timing the layers where that is quick: the cost model takes every
  // product at the sgemm-512 rate and every op at 5 us, which small layers
  // are far from (a 6-block Transformer of width 64: 8.2 ms a step
  // predicted, 62 ms run, 68 ms timed in 0.3 s). Rates the user gave keep
  // the cost model, as they ask for it.
  std::string timed_why, model_why;
  if (!measured && measure_under > 0 && flops <= 0 &&
      absl::GetFlag(FLAGS_memory_gbps) <= 0 && overhead_flag < 0) {
    flops = MeasureSgemmFlops();
    flops_how = "sgemm 512^3, 1 thread";
    const double estimate = MeasuringSeconds(*shapes, spec_mb, flops);
    // The timing holds the whole model and one micro-batch's activations,
    // as one stage under 1F1B does: a model that needs more than a quarter
    // of this machine's memory, or 4 GiB, is left to --measure (a large
    // embedding table has few FLOPs).
    const int64_t needs = MeasuringBytes(*spec, *shapes);
    if (needs > std::min(SystemMemoryLimit() / 4, kMeasureMemoryCap)) {
      model_why = absl::StrCat(
          "; timing the layers would hold about ", FormatBytes(needs),
          ", more than is left to a plan here (--measure times them anyway)");
    } else if (estimate < measure_under) {
      measured = true;
      timed_why = absl::StrFormat(
          "; timed as the cost model puts that at %.1f s, under "
          "--measure-under %g",
          estimate, measure_under);
    } else {
      model_why = absl::StrFormat(
          "; timing the layers would take about %.0f s: --measure does",
          estimate);
    }
  }
  if (measured) {
    // Forward and backward apart, as a stage runs them (the first layer's
    // backward without the input gradient): backward is not 2x forward
    // everywhere.
    // Out of memory is this command's failure (exit 1), not the process's
    // last words (exit 3 reads as "the spec's configuration is refused").
    const auto measure = [&](int64_t mb) -> absl::StatusOr<LayerPasses> {
      try {
        return MeasureLayerPasses(*spec, mb, kMeasureReps);
      } catch (const std::bad_alloc&) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "--measure: out of memory timing the layers at ", mb,
            " samples a micro-batch (about ",
            FormatBytes(MeasuringBytes(*spec, *shapes)),
            " for the whole model): plan with the cost model, without "
            "--measure"));
      }
    };
    absl::StatusOr<LayerPasses> at_spec = measure(spec_mb);
    if (!at_spec.ok()) return Fail(at_spec.status());
    // A second size separates the fixed from the per-sample part.
    LayerPasses at_one = *at_spec;
    if (spec_mb > 1) {
      absl::StatusOr<LayerPasses> one = measure(1);
      if (!one.ok()) return Fail(one.status());
      at_one = *std::move(one);
    }
    const auto split = [&](double t, double t1, double& per_sample,
                           double& fixed) {
      per_sample = spec_mb > 1 ? std::max(0.0, (t - t1) / (spec_mb - 1))
                               : t;  // one size: no fixed part to tell
      fixed = overhead_flag >= 0 ? overhead_flag
                                 : std::max(0.0, t - per_sample * spec_mb);
    };
    for (int64_t l = 0; l < layers; ++l) {
      split(at_spec->forward[l], at_one.forward[l], forward_per_sample[l],
            forward_fixed[l]);
      split(at_spec->backward[l], at_one.backward[l], backward_per_sample[l],
            backward_fixed[l]);
      partition_costs[l] = at_spec->forward[l] + at_spec->backward[l];
    }
    // The weight halves timed as zero-bubble schedules run them: the
    // estimate from the forward's product placed ZB-V's chunks' time
    // differently from what they take.
    weight_per_sample.assign(layers, 0);
    weight_fixed.assign(layers, 0);
    for (int64_t l = 0; l < layers; ++l) {
      split(at_spec->weight[l], at_one.weight[l], weight_per_sample[l],
            weight_fixed[l]);
    }
    absl::StatusOr<LayerStepSeconds> once =
        MeasureLayerStepSeconds(*spec, spec_mb, kMeasureReps);
    if (!once.ok()) return Fail(once.status());
    norm = once->norm;
    update = once->update;
    cost_source = absl::StrCat(
        "measured per layer (median of ", kMeasureReps, ", micro-batches of ",
        spec_mb, spec_mb > 1 ? " and 1" : "", ", 1 thread", timed_why, ")");
  } else {
    if (flops <= 0) {
      flops = MeasureSgemmFlops();
      flops_how = "sgemm 512^3, 1 thread";
    }
    const std::vector<double> model_costs = CostModelLayerCosts(*shapes);
    // The once-a-step passes are memory-bound: bytes over the triad's rate.
    double bandwidth = absl::GetFlag(FLAGS_memory_gbps) * 1e9;
    std::string bandwidth_how = "given";
    if (bandwidth <= 0) {
      bandwidth = MeasureTriadBytesPerSecond();
      bandwidth_how = "triad, 1 thread";
    }
    weight_read.assign(layers, 0);
    for (int64_t l = 0; l < layers; ++l) {
      const LayerCost& cost = shapes->costs[l];
      // An embedding gathers its batch's rows and scatters their
      // gradients: it reads no whole table.
      weight_read[l] = spec->model().layers(static_cast<int>(l)).has_embedding()
                           ? 0
                           : cost.param_bytes / bandwidth;
      // The input and the weight gradient are each a product as large as
      // the forward.
      forward_per_sample[l] = cost.forward_flops / flops;
      // The first layer computes no input gradient.
      backward_per_sample[l] =
          (InputGradUsed(l) ? 2 : 1) * forward_per_sample[l];
      forward_fixed[l] = backward_fixed[l] =
          overhead_flag >= 0 ? overhead_flag : kDefaultLayerOverhead;
      partition_costs[l] = model_costs[l];
      norm[l] = kNormTraffic * cost.param_bytes / bandwidth;
      // Re-packing reads the weight and writes its two packed copies.
      update[l] = (UpdateTraffic(spec->optimizer()) * cost.param_bytes +
                   1.5 * cost.packed_weight_bytes) /
                  bandwidth;
    }
    cost_source = absl::StrFormat(
        "cost model at %.1f GFLOP/s per stage (%s), each product at least "
        "its weight's read and updates at %.1f GB/s (%s)",
        flops / 1e9, flops_how, bandwidth / 1e9, bandwidth_how);
    cost_source += model_why;
  }
  double mean_overhead = 0, once_seconds = 0;
  for (int64_t l = 0; l < layers; ++l)
    mean_overhead += (forward_fixed[l] + backward_fixed[l]) / (2 * layers);
  for (int64_t l = 0; l < layers; ++l) once_seconds += norm[l] + update[l];
  cost_source += absl::StrFormat(
      ", %.1f us a layer per op, %.3f ms a step for the gradient norm and "
      "the updates (all layers)",
      mean_overhead * 1e6, once_seconds * 1e3);

  // The spec's balance is for its own K (and v); other K are balanced by
  // the same costs the simulation uses, so a measured plan is balanced by
  // measurement.
  const int64_t v_flag = absl::GetFlag(FLAGS_virtual_stages);
  if (v_flag != 0 && (v_flag < 2 || v_flag > layers)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--virtual-stages: the interleaved schedule needs 2 to ", layers,
        " chunks a stage (the model's layers), got ", v_flag)));
  }
  // Replicas run one chunk a worker: --virtual-stages was dropped in
  // silence beside them.
  if (v_flag != 0 && pinned_replicas > 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--virtual-stages ", v_flag, " with --replicas ", pinned_replicas,
        ": replicas run gpipe, 1f1b and zb-h1, one chunk a worker; the "
        "interleaved schedule and zb-v run one pipeline")));
  }
  // As `gpipectl train` refuses it: the plan planned 2 in silence.
  if (v_flag != 0 && v_flag != 2 && schedules.size() == 1 &&
      schedules[0] == ScheduleKind::kZeroBubbleV) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--virtual-stages: the zb-v schedule places exactly 2 virtual "
        "stages (chunks) per worker, got ",
        v_flag)));
  }
  const int64_t spec_v =
      v_flag > 0 ? v_flag
      : Interleaves(ScheduleFromSpec(spec->pipeline().schedule()))
          ? VirtualStageCount(*spec)
          : 2;
  // Why configurations the ranges hold were not simulated: the error when
  // none was.
  std::set<std::string> skipped;
  // On a terminal, a line that says where the plan is once it has taken a
  // second: a model of thousands of layers took a minute without a word.
  const bool tty = isatty(STDERR_FILENO) != 0;
  const auto plan_began = std::chrono::steady_clock::now();
  bool ticker_drawn = false;
  const auto tick = [&](int64_t k, int64_t lo, int64_t hi) {
    const double seconds = std::chrono::duration<double>(
                               std::chrono::steady_clock::now() - plan_began)
                               .count();
    if (!tty || seconds < 1) return;
    std::fprintf(stderr, "\r\033[Ksimulating K=%lld of %lld..%lld (%.0f s)",
                 static_cast<long long>(k), static_cast<long long>(lo),
                 static_cast<long long>(hi), seconds);
    std::fflush(stderr);
    ticker_drawn = true;
  };
  // `own_replicas` > 0: only that R (the spec's own row).
  const auto plan = [&](int64_t lo, int64_t hi, const std::vector<int64_t>& ms,
                        const std::vector<ScheduleKind>& kinds,
                        const std::vector<RematMode>& modes,
                        int64_t own_replicas =
                            0) -> absl::StatusOr<std::vector<Option>> {
    std::vector<Option> out;
    for (int64_t k = lo; k <= hi; ++k) {
      if (own_replicas == 0) tick(k, lo, hi);
      // Each remat mode (and chunk count, and ZB-V's M) has its own cut:
      // stages that re-materialize do more for the same layers
      // (RematStageWeights).
      std::map<std::tuple<RematMode, int64_t, int64_t>, std::vector<int64_t>>
          balances;
      const auto balance_for =
          [&](RematMode remat, int64_t v, ScheduleKind schedule,
              int64_t m) -> absl::StatusOr<std::vector<int64_t>> {
        // ZB-V's cut depends on M (PartitionForSchedule); the others' not.
        const bool v_shape = schedule == ScheduleKind::kZeroBubbleV;
        const auto key = std::make_tuple(remat, v, v_shape ? m : 0);
        auto it = balances.find(key);
        if (it != balances.end()) return it->second;
        const int64_t chunks = k * v;
        const bool explicit_balance =
            spec->pipeline().balance_size() == chunks && k == StageCount(*spec);
        // The spec's own row is cut as train, local and submit cut it (the
        // cost model's FLOPs, PartitionJob), not by the costs this plan
        // measured: its memory and refusal are those of the run (it showed
        // 1,2,1,9 and 191 MiB for the CNN example, which runs 1,1,2,9 and
        // 167 MiB, and exited 3 under a budget the run fits).
        const bool runs_cut =
            explicit_balance || (own_replicas > 0 && k == StageCount(*spec));
        absl::StatusOr<std::vector<int64_t>> balance =
            runs_cut ? PartitionJob(*spec, chunks)
                     : PartitionForSchedule(
                           *spec, *shapes, partition_costs, chunks,
                           v_shape ? schedule : ScheduleKind::kOneFOneB, m,
                           remat, RematStageWeights(remat, chunks),
                           /*first_layer_input_half=*/!measured);
        if (!balance.ok()) return balance.status();
        return balances[key] = *std::move(balance);
      };
      for (int64_t m : ms) {
        const int64_t mb = (batch + m - 1) / m;
        // Each layer's ops at this micro-batch size, once for every cut and
        // schedule: the forward's product (StageCostsFromLayers adds the
        // rest), the whole backward and its weight half (a split backward
        // does the same work in two ops).
        std::vector<double> forward(layers), backward(layers), weight(layers);
        for (int64_t l = 0; l < layers; ++l) {
          const LayerCost& cost = shapes->costs[l];
          const double product = forward_per_sample[l] * mb;
          forward[l] = product;
          backward[l] = backward_fixed[l] + backward_per_sample[l] * mb;
          if (measured) {
            weight[l] = weight_fixed[l] + weight_per_sample[l] * mb;
            continue;
          }
          // The cost model: the forward and the input half read the
          // weight, the weight half reads and writes its gradient (an
          // embedding's scatter reads no whole table: weight_read 0).
          const double weight_product =
              cost.forward_flops > 0
                  ? product *
                        std::min(1.0, cost.weight_flops / cost.forward_flops)
                  : product;
          weight[l] = 0;
          if (weight_read[l] > 0) {
            forward[l] = std::max(product, weight_read[l]);
            backward[l] =
                backward_fixed[l] + std::max(product, 2 * weight_read[l]) +
                (InputGradUsed(l) ? std::max(product, weight_read[l]) : 0);
          }
          // The fixed part of a layer's backward is mostly memory
          // traffic, which splits with it rather than doubling.
          if (cost.deferred_bytes > 0) {
            weight[l] = std::max(weight_product, 2 * weight_read[l]) +
                        backward_fixed[l] / 2;
          }
        }
        const auto stage_costs = [&](const std::vector<int64_t>& balance) {
          std::vector<StageCost> costs =
              StageCostsFromLayers(*shapes, forward, balance, mb);
          const std::vector<int64_t> begins = StageBegins(balance);
          for (size_t s = 0; s < balance.size(); ++s) {
            // The backwards and weight halves above replace
            // StageCostsFromLayers' estimates from the forward.
            costs[s].backward_seconds = 0;
            costs[s].weight_seconds = 0;
            for (int64_t l = begins[s]; l < begins[s] + balance[s]; ++l) {
              costs[s].norm_seconds += norm[l];
              costs[s].update_seconds += update[l];
              costs[s].forward_seconds += forward_fixed[l];
              costs[s].backward_seconds += backward[l];
              costs[s].weight_seconds += weight[l];
            }
            // The weight half is the forward's product (StageCostsFromLayers)
            // and never more than the backward it is part of.
            costs[s].weight_seconds =
                std::min(costs[s].weight_seconds, costs[s].backward_seconds);
          }
          return costs;
        };
        for (ScheduleKind schedule : kinds) {
          // The spec's own row is simulated as the spec runs, whatever
          // --virtual-stages asks of the others.
          const int64_t v = schedule == ScheduleKind::kZeroBubbleV ? 2
                            : !Interleaves(schedule)               ? 1
                            : own_replicas > 0 ? VirtualStageCount(*spec)
                                               : spec_v;
          // Interleaving needs M a multiple of K and K x v layers at least.
          if (const std::string error = ScheduleShapeError(schedule, k, m, v);
              !error.empty()) {
            skipped.insert(error);
            continue;
          }
          if (k * v * m > kMaxStagePasses) {
            skipped.insert(absl::StrCat(
                "K=", k, v > 1 ? absl::StrCat(" x ", v, " chunks") : "",
                " with M=", m, " is more than ", kMaxStagePasses,
                " micro-batch passes a step, as a spec may hold"));
            continue;
          }
          if (k * v > layers) {
            skipped.insert(
                absl::StrCat(std::string(ScheduleName(schedule)), " needs ",
                             k * v, " chunks of at least one layer for K=", k,
                             " (", v, " a stage); the model has ", layers));
            continue;
          }
          std::vector<int64_t> rs = own_replicas > 0
                                        ? std::vector<int64_t>{own_replicas}
                                        : replica_choices(k, m, schedule);
          if (rs.empty()) {
            skipped.insert(absl::StrCat(
                pinned_replicas > 0
                    ? absl::StrCat("--replicas ", pinned_replicas,
                                   " does not fit")
                    : std::string("no replica count fits"),
                ": the gradient groups G (the spec's gradientGroups, else "
                "R) must divide M (the plan tries powers of two; "
                "--micro-batches gives one), R be at most G, K x R fit the "
                "workers, and the schedule be gpipe, 1f1b or zb-h1"));
          }
          for (RematMode remat : modes) {
            for (int64_t r : rs) {
              Option o;
              o.k = k;
              o.m = m;
              o.r = r;
              o.v = v;
              o.schedule = schedule;
              o.remat = remat;
              ASSIGN_OR_RETURN(o.balance, balance_for(remat, v, schedule, m));
              o.costs = stage_costs(o.balance);
              SimulationConfig config;
              config.stages = o.costs;
              // Each replica runs whole groups of M / G micro-batches of the
              // same size; with G groups over R replicas unevenly (G = 4,
              // R = 3: 1, 1, 2) the replica with the most sets the pace.
              const int64_t groups = pinned_groups > 0 ? pinned_groups : r;
              int64_t m_r = 0;
              for (int64_t replica = 0; replica < r; ++replica) {
                const RowRange mine =
                    ReplicaMicroBatches(m, groups, r, replica);
                m_r = std::max(m_r, mine.end - mine.begin);
              }
              config.micro_batches = m_r;
              config.schedule = schedule;
              config.virtual_stages = v;
              config.remat = remat;
              // The order a run builds: for the cost model's phase times,
              // also when the costs here were measured (--measure).
              // ZB-V's order is built once, for the simulation and the
              // memory model alike.
              if (schedule == ScheduleKind::kZeroBubbleV) {
                config.order_ticks = CostModelTicks(*shapes, o.balance, remat);
                config.ops = MakeWorkerSchedules(schedule, k, m_r, v,
                                                 config.order_ticks);
              }
              config.link_bytes_per_second = link_gbps * 1e9 / 8;
              config.link_latency_seconds = link_latency_us * 1e-6;
              config.message_seconds = message_us * 1e-6;
              config.sends_wait_for_link = blocking_sends;
              o.sim = Simulate(config);
              const std::vector<int64_t> begins = StageBegins(o.balance);
              for (size_t c = 0; c < o.balance.size(); ++c) {
                int64_t bytes = 0;
                for (int64_t l = begins[c]; l < begins[c] + o.balance[c]; ++l)
                  bytes = SaturatingSum({bytes, shapes->costs[l].param_bytes});
                o.reduce_seconds = std::max(
                    o.reduce_seconds,
                    ReduceSeconds(r, bytes, config.link_bytes_per_second,
                                  config.link_latency_seconds,
                                  config.message_seconds));
              }
              const double step = o.sim.step_seconds + o.reduce_seconds;
              o.samples_per_second = step > 0 ? batch / step : 0;
              for (const StageSimulation& st : o.sim.stages) {
                o.min_bubble = std::min(o.min_bubble, st.bubble_fraction);
                o.max_bubble = std::max(o.max_bubble, st.bubble_fraction);
              }
              // A replica's stages: its m_r micro-batches of the same size
              // (a replica's share of the batch: the batch term then counts
              // that share, where a replica's first stage gathers the whole
              // batch, a little less), and the replicas' sum. Evaluation
              // batches keep their size.
              gpipe::v1::JobSpec for_r = *spec;
              for_r.mutable_pipeline()->set_replicas(r);
              if (r > 1) {
                for_r.set_batch_size((batch * m_r + m - 1) / m);
                if (spec->eval().batch_size() == 0)
                  for_r.mutable_eval()->set_batch_size(batch);
              }
              o.memory = EstimatePipelineMemory(
                  for_r, *shapes, o.balance, m_r, schedule, remat, v,
                  config.ops.empty() ? nullptr : &config.ops);
              // A worker holds its v chunks: their estimates add up.
              for (int64_t w = 0; w < k; ++w) {
                std::vector<StageMemory> chunks;
                for (int64_t c = 0; c < v; ++c)
                  chunks.push_back(o.memory[StageOfChunk(schedule, k, w, c)]);
                o.peak_bytes = std::max(o.peak_bytes, Combined(chunks).total());
              }
              out.push_back(std::move(o));
            }
          }
        }
      }
    }
    return out;
  };

  // The default range grows past its end while the best K sits at it (a
  // deep model may want more stages than 8).
  const bool default_range = absl::GetFlag(FLAGS_stages_range).empty() &&
                             absl::GetFlag(FLAGS_stages) == 0;
  const auto started = std::chrono::steady_clock::now();
  std::vector<Option> options;
  const Option* best = nullptr;
  const auto pick_best = [&] {
    best = nullptr;
    for (const Option& o : options) {
      if (Fits(o, *budget) && (best == nullptr || Better(o, *best))) best = &o;
    }
  };
  int64_t grown_from = 0;
  bool growth_stopped = false;
  // Each growth simulates only the Ks it adds.
  for (int64_t from = k_lo;;) {
    const auto round_began = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<Option>> planned =
        plan(from, k_hi, micro_batches, schedules, remats);
    const auto round = std::chrono::steady_clock::now() - round_began;
    if (!planned.ok()) return Fail(planned.status());
    options.insert(options.end(), std::make_move_iterator(planned->begin()),
                   std::make_move_iterator(planned->end()));
    pick_best();
    if (!default_range || best == nullptr || best->k != k_hi ||
        k_hi >= layers || (workers > 0 && k_hi >= workers)) {
      break;
    }
    // Each doubling costs more than all before it (a 257-layer model went
    // to K=256 in five minutes): the user picks the range past the budget,
    // and before a doubling that would overrun it (about 4 times the last
    // one: the budget was checked only after it, and a plan took 60 s).
    if (std::chrono::steady_clock::now() - started + 4 * round >
        kGrowthBudget) {
      growth_stopped = true;
      break;
    }
    if (grown_from == 0) grown_from = k_hi;
    from = k_hi + 1;
    k_hi = std::min(layers, 2 * k_hi);
    if (workers > 0) k_hi = std::min(k_hi, workers);
  }
  if (ticker_drawn) std::fprintf(stderr, "\r\033[K");
  const double simulate_ms = std::chrono::duration<double, std::milli>(
                                 std::chrono::steady_clock::now() - started)
                                 .count();
  if (options.empty()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "no configuration to simulate: ",
        absl::StrJoin(
            skipped.begin(),
            std::next(skipped.begin(), std::min<size_t>(3, skipped.size())),
            "; "),
        skipped.size() > 3
            ? absl::StrCat("; and ", skipped.size() - 3, " more such reasons")
            : "")));
  }

  // The spec's own configuration, simulated the same way, whether or not
  // the flags' ranges include it.
  std::optional<Option> spec_option;
  if (own_refused.empty()) {
    const int64_t k = StageCount(*spec), m = MicroBatchCount(*spec);
    absl::StatusOr<std::vector<Option>> own =
        plan(k, k, {m}, {ScheduleFromSpec(spec->pipeline().schedule())},
             {RematFromSpec(spec->pipeline().remat())}, ReplicaCount(*spec));
    if (own.ok() && own->size() == 1) spec_option = std::move(own->front());
  }

  std::printf("plan for %s: %lld layers, batch %lld\n",
              spec->name().empty() ? args[0].c_str() : spec->name().c_str(),
              static_cast<long long>(layers), static_cast<long long>(batch));
  if (batch_norm && absl::GetFlag(FLAGS_micro_batches) == 0) {
    std::printf(
        "M stays at the spec's %lld: batch norm normalizes each "
        "micro-batch by its own statistics, so another M trains another "
        "model (--micro-batches M plans one)\n",
        static_cast<long long>(micro_batches.front()));
  }
  std::printf(
      "costs: %s; links %.3g Gb/s, %.6g us, %.6g us a message, sends %s\n",
      cost_source.c_str(), link_gbps, link_latency_us, message_us,
      blocking_sends ? "wait for the link" : "return at once");
  if (with_replicas) {
    std::printf(
        "workers: %s; R data-parallel replicas of K stages each run M/R "
        "micro-batches, and the step adds the slowest stage's gradient sum "
        "over the links\n",
        workers > 0 ? std::to_string(workers).c_str() : "as many as K x R");
  }
  std::printf(
      "memory: the largest stage's peak (parameters, gradients, optimizer "
      "state, activations, working memory, data); budget %s\n\n",
      *budget > 0 ? FormatBytes(*budget).c_str() : "none");

  const bool single = k_lo == k_hi && micro_batches.size() == 1;
  PrintHeader(with_replicas);
  if (single) {
    // One configuration: every schedule and remat mode, then its stages.
    for (const Option& o : options) {
      const char* mark = &o == best ? "*" : Fits(o, *budget) ? " " : "!";
      std::printf("%s\n", Row(o, mark, with_replicas).c_str());
    }
  } else {
    // One row per (K, M): its best schedule, remat mode (and R) within the
    // budget, else its smallest; all of them were simulated (options come
    // grouped by K, then M).
    for (size_t i = 0; i < options.size();) {
      size_t end = i;
      while (end < options.size() && options[end].k == options[i].k &&
             options[end].m == options[i].m) {
        ++end;
      }
      const Option* pick = nullptr;
      for (size_t j = i; j < end; ++j) {
        const Option& o = options[j];
        if (Fits(o, *budget) && (pick == nullptr || Better(o, *pick)))
          pick = &o;
      }
      if (pick == nullptr) {
        for (size_t j = i; j < end; ++j) {
          if (pick == nullptr || options[j].peak_bytes < pick->peak_bytes)
            pick = &options[j];
        }
      }
      const char* mark = pick == best ? "*" : Fits(*pick, *budget) ? " " : "!";
      std::printf("%s\n", Row(*pick, mark, with_replicas).c_str());
      i = end;
    }
  }
  if (spec_option.has_value()) {
    // What the spec asks for, for comparison with the best.
    const bool fits = Fits(*spec_option, *budget);
    std::printf("%s  (the job spec's own)\n",
                Row(*spec_option, fits ? "=" : "!", with_replicas).c_str());
    // Workers of that memory would refuse it at submit: said, and exit 3.
    if (!fits) {
      own_refused = absl::StrFormat(
          "its largest stage needs %.2f MiB, over the %s budget",
          spec_option->peak_bytes / kMiB, FormatBytes(*budget));
    }
  }
  if (!own_refused.empty()) {
    std::printf("the job spec's own configuration does not run: %s\n",
                own_refused.c_str());
  }
  std::printf("\n%zu configurations simulated in %.1f ms (%s; = the spec's)\n",
              options.size(), simulate_ms,
              single ? "* best, ! over budget"
                     : "best schedule/remat per K and M; * best overall, ! "
                       "over budget");
  // The two columns were not said (a planning walkthrough).
  std::printf(
      "bubble: the share of the step the busiest stage idles (the "
      "pipeline's own); max: the idlest stage's share (the cut's "
      "imbalance)\n");
  if (grown_from > 0) {
    std::printf(
        "K went past %lld to %lld: the best K was at the end of the default "
        "range 1..%lld\n",
        static_cast<long long>(grown_from), static_cast<long long>(k_hi),
        static_cast<long long>(grown_from));
  }
  if (growth_stopped) {
    std::printf(
        "K stopped at %lld after %.0f s with the best K at the end; "
        "--stages-range %lld..%lld simulates further\n",
        static_cast<long long>(k_hi), simulate_ms / 1e3,
        static_cast<long long>(k_hi),
        static_cast<long long>(std::min(layers, 2 * k_hi)));
  }
  if (best == nullptr) {
    const Option* smallest = &options[0];
    for (const Option& o : options)
      if (o.peak_bytes < smallest->peak_bytes) smallest = &o;
    std::printf(
        "no configuration fits the memory budget; the smallest needs "
        "%.2f MiB (K=%lld, M=%lld, %s, remat %s)\n",
        smallest->peak_bytes / kMiB, static_cast<long long>(smallest->k),
        static_cast<long long>(smallest->m), ScheduleText(*smallest).c_str(),
        std::string(RematName(smallest->remat)).c_str());
    return 1;
  }
  std::printf(
      "best: K=%lld%s M=%lld schedule %s remat %s balance [%s]: "
      "%s samples/s, %.3f ms a step, bubble %.1f%% (idlest stage "
      "%.1f%%), peak %.2f MiB a stage%s\n",
      static_cast<long long>(best->k),
      with_replicas ? absl::StrCat(" R=", best->r).c_str() : "",
      static_cast<long long>(best->m), ScheduleText(*best).c_str(),
      std::string(RematName(best->remat)).c_str(),
      absl::StrJoin(best->balance, ",").c_str(),
      RateText(best->samples_per_second).c_str(),
      (best->sim.step_seconds + best->reduce_seconds) * 1e3,
      best->min_bubble * 100, best->max_bubble * 100, best->peak_bytes / kMiB,
      best->r > 1 ? absl::StrFormat(" (gradient sum %.3f ms)",
                                    best->reduce_seconds * 1e3)
                        .c_str()
                  : "");
  if (single) PrintStageDetails(*best);
  // The figures are per stage at this machine's one-thread speed, as if
  // each had a core (or a machine) of its own: on a laptop that runs the
  // job itself, the stages would share its cores.
  if (const int cores = AvailableCores(); best->k * best->r > cores) {
    std::printf(
        "note: the figures give each of the %lld workers (K x R) a core of "
        "its own; "
        "this machine has %d, so `gpipectl train` or `local` here would run "
        "them %.1fx slower or worse (--workers %d plans for this machine)\n",
        static_cast<long long>(best->k * best->r), cores,
        static_cast<double>(best->k * best->r) / cores, cores);
  }
  // Without a budget nothing was ruled out: a best that this machine could
  // not hold under `local` is worth a word before a user tries it here.
  if (*budget <= 0) {
    const int64_t workers = best->k * best->r;
    const int64_t share = SharedMemoryLimit() / std::max<int64_t>(1, workers);
    if (best->peak_bytes > share) {
      std::printf(
          "note: no --memory-budget, so no configuration was ruled out; the "
          "best needs %s a stage, more than the %s each of its %lld workers "
          "would have of this machine's memory under `gpipectl local` "
          "(--memory-budget plans for a worker's memory for stages, as "
          "`gpipectl workers` shows it)\n",
          FormatBytes(best->peak_bytes).c_str(), FormatBytes(share).c_str(),
          static_cast<long long>(workers));
    }
  }
  // The plan is printed either way; a script that plans before it submits
  // learns from the status that the spec as written would be refused.
  return own_refused.empty() ? 0 : kOwnRefusedExit;
}

}  // namespace gpipe::cli
