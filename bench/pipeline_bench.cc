// The in-process pipeline against one stage, the GPipe bound and the
// simulator, side by side in one run on this machine:
//   K=2 stages with one thread each against K=1 with one thread, for
//   M in {1,2,4,8,16}; the ideal speedup is 2M/(M+1) (GPipe's bubble).
//   The simulator predicts the K=2 step from per-layer times measured here.
//   Re-materialization: its compute overhead and its activation memory
//   saving at K=2, M=8.
//   Schedules: GPipe, 1F1B and ZB-H1 at K=2 (and K=4 where the machine has
//   a core per stage) for M in {2,4,8}: step time, the bubble measured from
//   the stages' timelines against the simulator's and the formula, and the
//   largest stage's peak activation memory.
//   Replicas (--only replicas): K=2 x R=2 against K=2 x R=1 at M=8 with the
//   same two gradient groups (the same bits): step time against what the
//   stages' busy time allows on this machine's cores, and the gradient
//   sum's bandwidth against a plain copy of the same bytes.
// Usage: pipeline_bench [--steps N] [--warmup W] [--width D] [--batch B]
//                       [--only schedules|replicas] [--spec JOB.json]
// --spec compares the schedules on that job's model instead of the MLP.
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/args.h"
#include "bench/timing.h"
#include "services/core/memory.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/in_process_reduction.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/link_reduction.h"
#include "services/pipeline/memory_model.h"
#include "services/pipeline/partitioner.h"
#include "services/pipeline/simulator.h"
#include "services/transport/in_process_link.h"

namespace gpipe::bench {
namespace {

// A balanced MLP: 8 x (Linear D->D, ReLU) and a 16-class head.
gpipe::v1::JobSpec BalancedMlp(int64_t width, int64_t batch) {
  std::string layers;
  for (int i = 0; i < 8; ++i) {
    layers +=
        absl::StrCat(i ? "," : "", R"({"linear": {"inFeatures": )", width,
                     R"(, "outFeatures": )", width, R"(}}, {"relu": {}})");
  }
  layers += absl::StrCat(R"(, {"linear": {"inFeatures": )", width,
                         R"(, "outFeatures": 16}})");
  auto spec = ParseJobSpecJson(absl::StrCat(
      R"({"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [)", width,
      R"(]}}, "layers": [)", layers,
      R"(], "loss": {"softmaxCrossEntropy": {}}},
          "optimizer": {"lr": 0.01, "sgd": {"momentum": 0.9}},
          "data": {"synthetic": {"task": "CLASSES", "features": )",
      width, R"(, "classes": 16, "trainSamples": 4096, "testSamples": 16}},
          "batchSize": )",
      batch, R"(, "steps": 1000000, "seed": 1})"));
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    std::exit(1);
  }
  return *spec;
}

struct Measured {
  double step_seconds = 0;
  std::vector<int64_t> peak_bytes;
  // The memory model's training peak of each worker (its chunks' together),
  // for the same cut, M, schedule and remat.
  std::vector<int64_t> estimate_bytes;
  // Over the measured steps of every stage: (wall - busy) / wall, as the
  // bubble gauges count it.
  double bubble = 0;
  // Per measured step, summed over every stage of every replica.
  double busy_seconds = 0;
  double optimizer_seconds = 0;  // of which the updates'
  // ... forwards', split backwards' input and weight halves'
  double forward_seconds = 0, input_seconds = 0, weight_seconds = 0;

  // The slowest stage's gradient sum in the last step (replicas).
  double reduce_seconds = 0;
  int64_t gradient_bytes = 0;  // the largest stage's
};

// K workers; under the interleaved schedule each holds v chunks, and the
// bubble and peak are the worker's (its chunks' busy time and memory
// together).
Measured Run(const gpipe::v1::JobSpec& spec, int64_t k, int64_t m,
             RematMode remat, int warmup, int steps,
             std::shared_ptr<const Dataset> data,
             ScheduleKind schedule = ScheduleKind::kGPipe, int64_t v = 1,
             int64_t replicas = 1) {
  PipelineOptions o;
  o.replicas = replicas;
  o.stages = k;
  o.virtual_stages = v;
  o.micro_batches = m;
  o.schedule = schedule;
  o.remat = remat;
  o.threads_per_stage = 1;
  o.dataset = data;
  auto p = InProcessPipeline::Create(spec, o);
  if (!p.ok()) {
    std::fprintf(stderr, "%s\n", std::string(p.status().message()).c_str());
    std::exit(1);
  }
  std::vector<double> times;
  for (int s = 0; s < warmup + steps; ++s) {
    const double t = TimeSeconds([&] {
      if (!(*p)->Step().ok()) std::exit(1);
    });
    if (s >= warmup) times.push_back(t);
  }
  Measured out;
  out.step_seconds = Median(times);
  if (auto shapes = InferModelShapes(spec.model()); shapes.ok()) {
    const std::vector<StageMemory> model = EstimatePipelineMemory(
        spec, *shapes, (*p)->balance(), m, schedule, remat, v);
    for (int64_t w = 0; w < k && model.size() == static_cast<size_t>(k * v);
         ++w) {
      int64_t bytes = 0;
      for (int64_t c = 0; c < v; ++c)
        bytes += model[StageOfChunk(schedule, k, w, c)].training();
      out.estimate_bytes.push_back(bytes);
    }
  }
  double wall = 0, busy = 0;
  for (int64_t w = 0; w < k; ++w) {
    int64_t peak = 0;
    std::vector<double> step_wall(steps, 0.0);
    for (int64_t c = 0; c < v; ++c) {
      Stage& stage = (*p)->stage(StageOfChunk(schedule, k, w, c));
      peak += stage.peak_activation_bytes();
      std::vector<StepTimeline> kept = stage.timeline().Steps();
      const size_t from = kept.size() > static_cast<size_t>(steps)
                              ? kept.size() - static_cast<size_t>(steps)
                              : 0;
      for (size_t s = from; s < kept.size(); ++s) {
        double& at = step_wall[s - from];
        at = std::max(at, kept[s].wall_seconds());
        busy += kept[s].busy_seconds();
      }
    }
    for (double x : step_wall) wall += x;
    out.peak_bytes.push_back(peak);
  }
  out.bubble = wall > 0 ? 1 - busy / wall : 0;
  for (int64_t r = 0; r < replicas; ++r) {
    for (int64_t i = 0; i < k * v; ++i) {
      Stage& stage = (*p)->stage(i, r);
      std::vector<StepTimeline> kept = stage.timeline().Steps();
      const size_t from = kept.size() > static_cast<size_t>(steps)
                              ? kept.size() - static_cast<size_t>(steps)
                              : 0;
      for (size_t s = from; s < kept.size(); ++s) {
        out.busy_seconds += kept[s].busy_seconds() / steps;
        out.optimizer_seconds +=
            kept[s].busy_seconds(Phase::kOptimizer) / steps;
        out.forward_seconds += kept[s].busy_seconds(Phase::kForward) / steps;
        out.input_seconds +=
            kept[s].busy_seconds(Phase::kBackwardInput) / steps;
        out.weight_seconds +=
            kept[s].busy_seconds(Phase::kBackwardWeight) / steps;
      }
      out.reduce_seconds = std::max(out.reduce_seconds, stage.reduce_seconds());
      int64_t bytes = 0;
      for (const NamedParameter& np : stage.model().Parameters())
        bytes += np.param->grad.nbytes();
      out.gradient_bytes = std::max(out.gradient_bytes, bytes);
    }
  }
  return out;
}

// Seconds for `replicas` threads to sum one step's gradients of `floats`
// values each (one group per replica), replica r through `reducers[r]`
// (used again step after step, as a stage does): median of 9.
double TimeReduction(int64_t replicas, int64_t floats,
                     const std::vector<GradientReducer*>& reducers) {
  std::vector<std::unique_ptr<Parameter>> params(replicas);
  std::vector<std::vector<NamedParameter>> named(replicas);
  for (int64_t r = 0; r < replicas; ++r) {
    params[r] = std::make_unique<Parameter>();
    params[r]->grad = Tensor::Zeros({floats});
    named[r].push_back({"w", params[r].get()});
  }
  std::vector<double> times;
  for (int i = 0; i < 9; ++i) {
    times.push_back(TimeSeconds([&] {
      std::vector<std::thread> threads;
      for (int64_t r = 0; r < replicas; ++r) {
        threads.emplace_back([&, r] {
          GradientNode node;
          node.first = r;
          node.grads.push_back(params[r]->grad);
          std::vector<GradientNode> forest;
          forest.push_back(std::move(node));
          if (!reducers[r]->Reduce(r, i, std::move(forest), named[r]).ok())
            std::exit(1);
        });
      }
      for (auto& t : threads) t.join();
    }));
  }
  return Median(times);
}

// K=2 x R=2 against K=2 x R=1, both with two gradient groups; then the
// gradient sum alone, in memory and over links, against a plain copy.
void CompareReplicas(gpipe::v1::JobSpec spec, int warmup, int steps,
                     std::shared_ptr<const Dataset> data) {
  constexpr int64_t kM = 8;
  spec.mutable_pipeline()->set_micro_batches(kM);
  spec.mutable_pipeline()->set_gradient_groups(2);
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  std::printf(
      "replicas at K=2, M=%lld, 1f1b, 2 gradient groups (the same bits for "
      "R=1 and R=2), %d cores\n",
      static_cast<long long>(kM), cores);
  std::printf("%4s %10s %10s %12s %10s %14s %10s\n", "R", "step ms",
              "samples/s", "busy ms/step", "allowed ms", "meas/allowed",
              "reduce ms");
  double base = 0, work = 0, two = 0;
  int64_t gradient_bytes = 0;
  for (int64_t r : {1, 2}) {
    const Measured got = Run(spec, 2, kM, RematMode::kNever, warmup, steps,
                             data, ScheduleKind::kOneFOneB, 1, r);
    // The work is R=1's busy time (measured with a core per thread); what
    // the cores allow is that work spread over the cores, or over the
    // threads when there are fewer.
    if (r == 1) {
      base = got.step_seconds;
      work = got.busy_seconds;
    }
    gradient_bytes = got.gradient_bytes;
    two = got.step_seconds;
    const double allowed = work / std::min<int64_t>(cores, 2 * r);
    std::printf("%4lld %10.1f %10.0f %12.1f %10.1f %14.2f %10.2f\n",
                static_cast<long long>(r), got.step_seconds * 1e3,
                spec.batch_size() / got.step_seconds, got.busy_seconds * 1e3,
                allowed * 1e3, got.step_seconds / allowed,
                got.reduce_seconds * 1e3);
  }
  std::printf("R=2 vs R=1: %.2fx the samples/s\n", base / two);
  // The gradient sum alone: the largest stage's gradients, two replicas.
  const int64_t n = gradient_bytes / 4;
  InProcessReduction in_memory(2, 2);
  const double memory = TimeReduction(2, n, {&in_memory, &in_memory});
  auto [to_1, to_0] = MakeInProcessLinkPair(4);
  const std::vector<RowRange> shares = {{0, 1}, {1, 2}};
  LinkReduction zero(0, 2, shares, {nullptr, to_1.get()});
  LinkReduction one(1, 2, shares, {to_0.get(), nullptr});
  const double over_links = TimeReduction(2, n, {&zero, &one});
  std::vector<float> a(n, 1.0f), b(n);
  std::vector<double> copies;
  for (int i = 0; i < 9; ++i) {
    copies.push_back(
        TimeSeconds([&] { std::copy(a.begin(), a.end(), b.begin()); }));
  }
  const double copy = Median(copies);
  const double gb = gradient_bytes / 1e9;
  std::printf(
      "\ngradient sum of the largest stage (%.1f MiB, 2 replicas, one group "
      "each), median of 9:\n"
      "  in memory (InProcessReduction)  %7.2f ms  %6.2f GB/s  %5.1fx a copy\n"
      "  over links (LinkReduction)      %7.2f ms  %6.2f GB/s  %5.1fx a copy\n"
      "  a plain copy of the same bytes  %7.2f ms  %6.2f GB/s\n",
      gradient_bytes / 1048576.0, memory * 1e3, gb / memory, memory / copy,
      over_links * 1e3, gb / over_links, over_links / copy, copy * 1e3,
      gb / copy);
  std::printf(
      "\nbusy = every stage of every replica, per step; allowed = R=1's busy "
      "time / min(cores, threads): the step the cores allow if nothing "
      "waited; reduce = the slowest stage's gradient sum in the last step, "
      "waiting for the other replica included\n");
}

// What the in-process links cost, measured on `bytes`-sized messages: each
// side's copy (Clone, median of 31), and the rest of a message's one-way
// time (waking the receiver) from 31 round trips between two threads.
// bytes: the size asked for (0: not measured yet).
struct InProcessLinkCosts {
  int64_t bytes = 0;
  double copy_bytes_per_second = 0;
  double message_seconds = 0;
};

InProcessLinkCosts MeasureInProcessLink(int64_t bytes) {
  constexpr int kTrips = 31;
  const Tensor sent = Tensor::Zeros({std::max<int64_t>(bytes / 4, 1)});
  std::vector<double> copies;
  for (int i = 0; i < kTrips; ++i)
    copies.push_back(TimeSeconds([&] { Tensor c = sent.Clone(); }));
  auto [a, b] = MakeInProcessLinkPair(4);
  std::thread echo([&b = *b] {
    for (int i = 0; i < kTrips; ++i) {
      absl::StatusOr<Message> m = b.Receive();
      if (!m.ok() || !b.Send(*std::move(m)).ok()) return;
    }
  });
  std::vector<double> trips;
  for (int i = 0; i < kTrips; ++i) {
    trips.push_back(TimeSeconds([&a = *a, &sent] {
      Message m;
      m.tensor = sent;
      if (a.Send(std::move(m)).ok()) (void)a.Receive();
    }));
  }
  echo.join();
  InProcessLinkCosts costs;
  costs.bytes = bytes;
  const double copy = Median(copies);
  costs.copy_bytes_per_second = static_cast<double>(sent.nbytes()) / copy;
  // A trip is two messages, each two copies and a wake.
  costs.message_seconds = std::max(0.0, Median(trips) / 2 - 2 * copy);
  return costs;
}

// The shares of a one-stage step's layer time that its forwards, input
// halves and weight halves take (a split backward's, measured): the cost
// model prices a weight half like a forward, but at small micro-batches it
// reads and writes the whole weight gradient and takes longer.
struct PhaseShares {
  double forward = 0, input = 0, weight = 0;
};

PhaseShares SharesOf(const Measured& split) {
  const double sum =
      split.forward_seconds + split.input_seconds + split.weight_seconds;
  if (sum <= 0) return {};
  return {split.forward_seconds / sum, split.input_seconds / sum,
          split.weight_seconds / sum};
}

// The simulator's K-stage step for M micro-batches. Relative layer costs
// come from the cost model; their absolute scale from the measured
// single-stage step at the same M less its updates (the data and loss time
// spread over the layers in proportion). The updates run once a step after
// each stage's last op, not pipelined with its layers: the simulator's
// update op, each stage's share by its parameter bytes (the pass is bound
// by memory).
SimulationResult PredictStep(const gpipe::v1::JobSpec& spec, int64_t k,
                             int64_t m, RematMode remat, ScheduleKind schedule,
                             double measured_one_stage_seconds,
                             double measured_optimizer_seconds, int64_t v = 1,
                             InProcessLinkCosts* link = nullptr,
                             const PhaseShares& shares = {}) {
  const ModelShapes shapes = *InferModelShapes(spec.model());
  const int64_t mb = spec.batch_size() / m;
  std::vector<double> costs = CostModelLayerCosts(shapes);
  int64_t all_params = 0;
  for (const LayerCost& c : shapes.costs) all_params += c.param_bytes;
  double update_seconds = 0;
  // Each phase scaled to its measured share of the whole model's time (the
  // factors do not change with the costs' common scale below).
  double forward_factor = 1, input_factor = 1, weight_factor = 1;
  if (shares.forward > 0) {
    const StageCost whole = StageCostsFromLayers(
        shapes, costs, {static_cast<int64_t>(shapes.costs.size())}, mb)[0];
    const double f = whole.forward_seconds, w = whole.weight_seconds,
                 b = whole.backward_seconds - w, sum = f + b + w;
    forward_factor = shares.forward * sum / std::max(f, 1e-30);
    input_factor = shares.input * sum / std::max(b, 1e-30);
    weight_factor = shares.weight * sum / std::max(w, 1e-30);
  }
  InProcessLinkCosts local_link;
  if (link == nullptr) link = &local_link;
  auto simulate = [&](int64_t stages, RematMode mode, ScheduleKind kind,
                      int64_t chunks) {
    // Cut as the in-process pipeline cuts for this remat mode.
    gpipe::v1::JobSpec for_k = spec;
    for_k.mutable_pipeline()->set_stages(stages);
    for_k.mutable_pipeline()->set_remat(RematToSpec(mode));
    for_k.mutable_pipeline()->set_schedule(ScheduleToSpec(kind));
    for_k.mutable_pipeline()->set_micro_batches(m);
    const std::vector<int64_t> balance = *PartitionJob(for_k, stages * chunks);
    SimulationConfig config;
    config.stages = StageCostsFromLayers(shapes, costs, balance, mb);
    for (StageCost& c : config.stages) {
      const double input =
          (c.backward_seconds - c.weight_seconds) * input_factor;
      c.forward_seconds *= forward_factor;
      c.weight_seconds *= weight_factor;
      c.backward_seconds = input + c.weight_seconds;
    }
    const std::vector<int64_t> begins = StageBegins(balance);
    for (size_t s = 0; s < balance.size() && all_params > 0; ++s) {
      int64_t params = 0;
      for (int64_t l = begins[s]; l < begins[s] + balance[s]; ++l)
        params += shapes.costs[l].param_bytes;
      config.stages[s].update_seconds =
          update_seconds * static_cast<double>(params) / all_params;
    }
    config.micro_batches = m;
    config.remat = mode;
    config.schedule = kind;
    config.virtual_stages = chunks;
    // The order the in-process pipeline runs: ZB-V's for the cost model's
    // phase times, whatever the measured ones are.
    if (kind == ScheduleKind::kZeroBubbleV)
      config.order_ticks = CostModelTicks(shapes, balance, mode);
    if (stages > 1) {
      // The links as measured: every message copied by both stages, and
      // the receiver woken, with no transfer in between (one address space).
      // Measured once for each message size, and kept in *link for the
      // caller's next prediction.
      int64_t bytes = 0;
      for (const StageCost& c : config.stages)
        bytes = std::max(bytes, c.output_bytes);
      if (link->bytes != bytes) *link = MeasureInProcessLink(bytes);
      config.link_bytes_per_second = 1e15;
      config.copy_bytes_per_second = link->copy_bytes_per_second;
      config.message_seconds = link->message_seconds;
    }
    return Simulate(config);
  };
  const double layers_seconds =
      std::max(measured_one_stage_seconds - measured_optimizer_seconds,
               0.5 * measured_one_stage_seconds);
  const double scale =
      layers_seconds /
      simulate(1, RematMode::kNever, ScheduleKind::kGPipe, 1).step_seconds;
  for (double& c : costs) c *= scale;
  update_seconds = measured_one_stage_seconds - layers_seconds;
  return simulate(k, remat, schedule, v);
}

double Predict(const gpipe::v1::JobSpec& spec, int64_t k, int64_t m,
               RematMode remat, double measured_one_stage_seconds,
               double measured_optimizer_seconds) {
  return PredictStep(spec, k, m, remat, ScheduleKind::kGPipe,
                     measured_one_stage_seconds, measured_optimizer_seconds)
      .step_seconds;
}

double MeanBubble(const SimulationResult& r) {
  double sum = 0;
  for (const StageSimulation& s : r.stages) sum += s.bubble_fraction;
  return r.stages.empty() ? 0 : sum / r.stages.size();
}

// GPipe, 1F1B, ZB-H1 and interleaved 1F1B (v = 2) side by side at K
// stages: measured step, measured and simulated bubble, the formula, and
// the largest stage's peak.
void CompareSchedules(const gpipe::v1::JobSpec& spec, int64_t k, int warmup,
                      int steps, std::shared_ptr<const Dataset> data) {
  std::printf("\nschedules at K=%lld (remat never):\n",
              static_cast<long long>(k));
  std::printf("%4s %11s %9s %10s %9s %9s %8s %8s %10s %9s %9s\n", "M", "sched",
              "step ms", "pred ms", "meas/pred", "bubble", "sim", "formula",
              "peak MiB", "model/pk", "vs 1f1b");
  std::string links;
  for (int64_t m : {2, 4, 8}) {
    const Measured one =
        Run(spec, 1, m, RematMode::kNever, warmup, steps, data);
    const PhaseShares shares =
        SharesOf(Run(spec, 1, m, RematMode::kNever, warmup, steps, data,
                     ScheduleKind::kZeroBubbleH1));
    // The same measured links for every schedule at this M.
    InProcessLinkCosts link;
    double ofob_bubble = 0;
    int64_t ofob_peak = 0;
    for (ScheduleKind schedule :
         {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
          ScheduleKind::kZeroBubbleH1, ScheduleKind::kInterleaved1F1B,
          ScheduleKind::kZeroBubbleV}) {
      const int64_t v = Interleaves(schedule) ? 2 : 1;
      if (!ScheduleShapeError(schedule, k, m, v).empty() ||
          k * v > spec.model().layers_size()) {
        continue;
      }
      const Measured r =
          Run(spec, k, m, RematMode::kNever, warmup, steps, data, schedule, v);
      const SimulationResult sim =
          PredictStep(spec, k, m, RematMode::kNever, schedule, one.step_seconds,
                      one.optimizer_seconds, v, &link, shares);
      if (schedule == ScheduleKind::kOneFOneB) {
        links = absl::StrFormat(
            "%s  M=%lld: forward %.0f%%, input halves %.0f%%, weight halves "
            "%.0f%%; %.0f KiB messages, copies %.1f GB/s, wake %.0f us\n",
            links, static_cast<long long>(m), 100 * shares.forward,
            100 * shares.input, 100 * shares.weight, link.bytes / 1024.0,
            link.copy_bytes_per_second / 1e9, link.message_seconds * 1e6);
      }
      const int64_t peak =
          *std::max_element(r.peak_bytes.begin(), r.peak_bytes.end());
      std::string versus = "-";
      if (schedule == ScheduleKind::kOneFOneB) {
        ofob_bubble = r.bubble;
        ofob_peak = peak;
      } else if (schedule != ScheduleKind::kGPipe && ofob_bubble > 0) {
        versus = absl::StrFormat("%.2f/%.2f", r.bubble / ofob_bubble,
                                 static_cast<double>(peak) / ofob_peak);
      }
      // The model's estimate over the measured peak, worker by worker: the
      // lowest and the highest ratio (1.00: exact; below: under).
      double lo = 0, hi = 0;
      for (size_t w = 0; w < r.estimate_bytes.size(); ++w) {
        if (r.peak_bytes[w] <= 0) continue;
        const double ratio =
            static_cast<double>(r.estimate_bytes[w]) / r.peak_bytes[w];
        lo = w == 0 ? ratio : std::min(lo, ratio);
        hi = std::max(hi, ratio);
      }
      const std::string model_ratio = absl::StrFormat("%.2f-%.2f", lo, hi);
      std::printf(
          "%4lld %11s %9.1f %10.1f %9.2f %8.1f%% %7.1f%% %7.1f%% %10.2f %9s "
          "%9s\n",
          static_cast<long long>(m),
          std::string(ScheduleName(schedule)).c_str(), r.step_seconds * 1e3,
          sim.step_seconds * 1e3, r.step_seconds / sim.step_seconds,
          100 * r.bubble, 100 * MeanBubble(sim),
          100 * TheoreticalBubble(schedule, k, m, v), peak / 1048576.0,
          model_ratio.c_str(), versus.c_str());
    }
  }
  std::printf(
      "the one-stage step's layer time by phase (split backward) and the "
      "in-process links, as measured for sim:\n%s",
      links.c_str());
}

}  // namespace
}  // namespace gpipe::bench

int main(int argc, char** argv) {
  using namespace gpipe;
  using namespace gpipe::bench;
  Args args(argc, argv, {"steps", "warmup", "width", "batch", "only", "spec"});
  if (!args.ok()) {
    std::fprintf(stderr, "pipeline_bench: %s\n", args.error().c_str());
    return 2;
  }
  const int steps = args.Int("steps", 8), warmup = args.Int("warmup", 2);
  gpipe::v1::JobSpec spec =
      BalancedMlp(args.Int("width", 1024), args.Int("batch", 256));
  if (const std::string path = args.Str("spec", ""); !path.empty()) {
    absl::StatusOr<gpipe::v1::JobSpec> loaded = LoadJobSpecFile(path);
    if (!loaded.ok()) {
      std::fprintf(stderr, "pipeline_bench: %s\n",
                   std::string(loaded.status().message()).c_str());
      return 2;
    }
    spec = *loaded;
    if (args.Has("batch")) spec.set_batch_size(args.Int("batch", 256));
    std::printf(
        "schedules on %s, batch %lld, 1 thread per stage, median of "
        "%d steps\n",
        path.c_str(), static_cast<long long>(spec.batch_size()), steps);
  }
  auto opened = OpenJobDataset(spec);
  std::shared_ptr<const Dataset> data(std::move(*opened));

  if (!args.Has("spec")) {
    std::printf(
        "in-process pipeline, MLP 8x(Linear %lld + ReLU) + head, batch %lld, "
        "1 thread per stage, median of %d steps\n\n",
        static_cast<long long>(args.Int("width", 1024)),
        static_cast<long long>(spec.batch_size()), steps);
  }
  const bool schedules_only =
      args.Str("only", "") == "schedules" || args.Has("spec");
  const auto compare_schedules = [&] {
    CompareSchedules(spec, 2, warmup, steps, data);
    if (std::thread::hardware_concurrency() >= 4) {
      CompareSchedules(spec, 4, warmup, steps, data);
    } else {
      std::printf(
          "(K=4 left out: %u cores here, and stages sharing a core measure "
          "the sharing, not the schedule)\n",
          std::thread::hardware_concurrency());
    }
    std::printf(
        "\nbubble = the stages' idle share of their measured steps (wall - "
        "busy, as the gauges count it); sim = the simulator's on the cost "
        "model's layer costs scaled to the measured K=1 step less its "
        "update, which the simulator runs once a step on each stage "
        "(shared by parameter bytes), and with the links' copies (one on "
        "each side of a message, on the stages' threads) and wake-ups "
        "measured in this run; formula = "
        "the schedule's on equal stages; interleaved holds 2 chunks per "
        "stage (its bubble and peak are the stage's); vs 1f1b = the "
        "schedule's bubble and largest peak over 1f1b's\n");
  };
  if (args.Str("only", "") == "replicas") {
    // As gpipectl and the worker do: freed blocks stay in the process, so
    // a step's gradient groups do not fault in fresh pages every step.
    KeepFreedMemory();
    CompareReplicas(spec, warmup, steps, data);
    return 0;
  }
  if (schedules_only) {
    compare_schedules();
    return 0;
  }
  std::printf("%4s %10s %10s %8s %8s %7s %12s %9s\n", "M", "K=1 ms", "K=2 ms",
              "speedup", "bound", "of bnd", "predicted ms", "meas/pred");
  for (int64_t m : {1, 2, 4, 8, 16}) {
    const Measured one =
        Run(spec, 1, m, RematMode::kNever, warmup, steps, data);
    const Measured two =
        Run(spec, 2, m, RematMode::kNever, warmup, steps, data);
    const double speedup = one.step_seconds / two.step_seconds;
    const double bound = 2.0 * m / (m + 1.0);
    const double predicted = Predict(spec, 2, m, RematMode::kNever,
                                     one.step_seconds, one.optimizer_seconds);
    std::printf("%4lld %10.1f %10.1f %8.2f %8.2f %6.0f%% %12.1f %9.2f\n",
                static_cast<long long>(m), one.step_seconds * 1e3,
                two.step_seconds * 1e3, speedup, bound, 100 * speedup / bound,
                predicted * 1e3, two.step_seconds / predicted);
  }

  std::printf("\nre-materialization at K=2, M=8:\n");
  const Measured never =
      Run(spec, 2, 8, RematMode::kNever, warmup, steps, data);
  const Measured one = Run(spec, 1, 8, RematMode::kNever, warmup, steps, data);
  const Measured always =
      Run(spec, 2, 8, RematMode::kAlways, warmup, steps, data);
  std::printf(
      "  step: %.1f ms without, %.1f ms with remat (%.0f%% compute overhead; "
      "predicted %.0f%%)\n",
      never.step_seconds * 1e3, always.step_seconds * 1e3,
      100 * (always.step_seconds / never.step_seconds - 1),
      100 * (Predict(spec, 2, 8, RematMode::kAlways, one.step_seconds,
                     one.optimizer_seconds) /
                 Predict(spec, 2, 8, RematMode::kNever, one.step_seconds,
                         one.optimizer_seconds) -
             1));
  for (int s = 0; s < 2; ++s) {
    std::printf(
        "  stage %d peak activations: %.2f MiB without, %.2f MiB with "
        "(%.1fx less)\n",
        s, never.peak_bytes[s] / 1048576.0, always.peak_bytes[s] / 1048576.0,
        static_cast<double>(never.peak_bytes[s]) / always.peak_bytes[s]);
  }
  std::printf(
      "\nspeedup = K=1 step / K=2 step; bound = 2M/(M+1), GPipe's bubble "
      "on 2 equal stages; meas/pred = measured K=2 step / simulator's\n"
      "prediction: the cost model's relative layer costs, scaled so\n"
      "that the simulated single stage matches the measured K=1 step at "
      "the same M (1.00 is perfect; the goal is within 10%%).\n");
  compare_schedules();
  return 0;
}
