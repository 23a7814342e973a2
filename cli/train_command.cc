// gpipectl train JOB.json: the single-process reference trainer, with a
// progress bar, a final evaluation and optional safetensors output.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cli/progress.h"
#include "cli/stage_figures.h"
#include "services/core/bytes.h"
#include "services/core/cores.h"
#include "services/core/memory.h"
#include "services/core/status.h"
#include "services/pipeline/data_resolution.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/layer_profile.h"
#include "services/pipeline/measured_cut.h"
#include "services/pipeline/memory_model.h"
#include "services/pipeline/model_file.h"
#include "services/pipeline/partitioner.h"
#include "services/pipeline/reference_trainer.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/simulator.h"
#include "services/pipeline/step_plan.h"
#include "services/storage/safetensors.h"
#include "services/telemetry/step_trace.h"
#include "services/telemetry/trace_files.h"
#include "services/tensor/device.h"
#include "services/tensor/threads.h"

ABSL_FLAG(int64_t, micro_batches, 0,
          "micro-batches per mini-batch (0: the job spec's)");
ABSL_FLAG(std::string, steps, "",
          "train, submit, local: training steps (default: the job spec's); "
          "resume: the job's steps in all, past its newest checkpoint "
          "(default: as before); "
          "trace: the steps to show, A..B (0-based, both included), A.., ..B "
          "or N (default: all the controller keeps)");
ABSL_FLAG(std::string, trace, "",
          "train, local: write the stage timelines of the last steps to "
          "DIR/trace.json (Chrome trace, for Perfetto) and DIR/timeline.svg");
ABSL_FLAG(std::string, out, "",
          "directory for model.safetensors with the final parameters");
ABSL_FLAG(int, threads, 0,
          "compute threads (0: the cores this process may use, CPU "
          "affinity and cgroup quota); with --stages K > 1 they are "
          "shared out among the stages");
ABSL_FLAG(int64_t, stages, 0,
          "pipeline stages K (0: the job spec's; 1: the single-process "
          "reference trainer)");
ABSL_FLAG(std::string, schedule, "",
          "gpipe, 1f1b, zb-h1, interleaved or zb-v (default: the job spec's)");
ABSL_FLAG(int64_t, replicas, 0,
          "data-parallel replicas R of the pipeline (train: each on its own "
          "K threads; local and submit: on K x R workers; 0: the job spec's "
          "pipeline.replicas); with "
          "pipeline.gradient_groups set in the spec the result is the same "
          "for every R up to it (unset, the groups are R; under zb-h1 and "
          "zb-v, R must be the groups)");
ABSL_FLAG(int64_t, virtual_stages, 0,
          "chunks of the model per stage under --schedule interleaved (v >= "
          "2; 0: the job spec's)");
ABSL_FLAG(std::string, balance, "",
          "layers per stage (per chunk under --schedule interleaved: K x V "
          "entries in model order): a list such as 2,3,1, or 'measured' to "
          "balance by profiled layer times (default: the spec's balance or "
          "the cost model)");
ABSL_FLAG(std::string, device, "cpu",
          "cpu, cuda or auto (the GPU when one is present)");
ABSL_FLAG(std::string, remat, "",
          "always, except_last or never (default: the job spec's)");

namespace gpipe::cli {
namespace {

int Fail(const absl::Status& status) { return FailCommand("train", status); }

void PrintEval(const char* when, const EvalResult& e, bool classification) {
  std::printf("%s: test loss %.4f", when, e.loss);
  if (classification)
    std::printf(", test accuracy %.4f", e.accuracy);
  else
    std::printf(", test token accuracy %.4f", e.accuracy);
  std::printf(" (%lld targets)\n", static_cast<long long>(e.counted));
  std::fflush(stdout);
}

// Set by the first Ctrl-C (SIGINT) while `train` runs: the loop stops
// after the step under way and writes what it has. A signal handler can
// only reach a flag of static storage, lock-free so that it is safe on
// whichever thread the signal lands; nothing else reads it.
std::atomic<bool> interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void OnInterrupt(int) {
  interrupted.store(true, std::memory_order_relaxed);
  // A second Ctrl-C ends the process at once, as it would have.
  std::signal(SIGINT, SIG_DFL);
}

// Catches SIGINT for its lifetime, restoring what was there. An ignored
// SIGINT stays ignored (a job started in the background of a script), as
// shells leave it.
class InterruptCatcher {
 public:
  InterruptCatcher() {
    interrupted = false;
    previous_ = std::signal(SIGINT, OnInterrupt);
    if (previous_ == SIG_IGN) std::signal(SIGINT, SIG_IGN);
  }
  ~InterruptCatcher() { Release(); }
  // Hands SIGINT back to what was there: a Ctrl-C from now on does what it
  // did before `train` caught it.
  void Release() {
    if (released_) return;
    released_ = true;
    std::signal(SIGINT, previous_);
  }
  InterruptCatcher(const InterruptCatcher&) = delete;
  InterruptCatcher& operator=(const InterruptCatcher&) = delete;

 private:
  void (*previous_)(int) = SIG_DFL;
  bool released_ = false;
};

absl::Status WriteModel(Trainer& trainer, const gpipe::v1::JobSpec& spec,
                        const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("--out: cannot create ", dir, ": ", ec.message()));
  }
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  const std::vector<NamedTensor> state = trainer.StateTensors();
  std::vector<Tensor> host;  // device tensors copied back for the file
  host.reserve(state.size());
  for (const NamedTensor& t : state) {
    host.push_back(t.tensor->To(Device::kCpu));
    tensors.emplace_back(t.name, &host.back());
  }
  return WriteSafetensors(dir + "/model.safetensors", tensors,
                          ModelFileMetadata(spec, trainer.step()));
}

// The last kTraceDirSteps steps each in-process stage kept, as the cluster's
// GetTrace returns them, in DIR/trace.json and DIR/timeline.svg.
absl::Status WritePipelineTrace(InProcessPipeline& pipeline,
                                const gpipe::v1::JobSpec& spec,
                                const std::string& dir) {
  gpipe::v1::GetTraceResponse trace;
  trace.set_job_id(spec.name().empty() ? "train" : spec.name());
  trace.set_stages(pipeline.stage_count());
  trace.set_micro_batches(pipeline.stage(0).placement().micro_batches);
  trace.set_schedule(ScheduleToSpec(pipeline.stage(0).placement().schedule));
  const int64_t first = std::max<int64_t>(0, pipeline.step() - kTraceDirSteps);
  trace.set_replicas(pipeline.replica_count());
  for (int64_t r = 0; r < pipeline.replica_count(); ++r) {
    for (int64_t i = 0; i < pipeline.stage_count(); ++i) {
      AppendTimeline(pipeline.stage(i, r).timeline(), i, &trace, r);
    }
  }
  gpipe::v1::GetTraceResponse last;
  last.CopyFrom(trace);
  last.clear_steps();
  for (const gpipe::v1::StepTrace& s : trace.steps()) {
    if (s.step() >= first) *last.add_steps() = s;
  }
  if (last.steps().empty()) {
    return absl::FailedPreconditionError("--trace: no step was recorded");
  }
  return WriteTraceDir(last, dir);
}

// The micro-batches each replica of the pipeline runs.
int64_t ReplicaMicroBatches(InProcessPipeline& pipeline) {
  return pipeline.stage(0).placement().micro_batches /
         std::max<int64_t>(1, pipeline.replica_count());
}

// The bubble each worker's stages explain: the schedule simulated on the
// times they measured over the steps their timelines keep (the cost
// model's nominal machine misprices some layers by several times). Empty
// until every stage has kept kMeasuredSteps steps.
std::vector<double> MeasuredCutBubbles(InProcessPipeline& pipeline) {
  // The first step places the activations in the heap; the median of
  // three steps no longer reads it.
  constexpr size_t kMeasuredSteps = 3;
  const int64_t g_count =
      pipeline.worker_count() * pipeline.chunks_per_worker();
  const int64_t m = ReplicaMicroBatches(pipeline);
  std::vector<StageCost> stages;
  for (int64_t g = 0; g < g_count; ++g) {
    const std::vector<StepTimeline> steps =
        pipeline.stage(g).timeline().Steps();
    if (steps.size() < kMeasuredSteps) return {};
    std::optional<StageCost> cost = MeasuredStageCost(steps, m);
    if (!cost) return {};
    stages.push_back(*cost);
  }
  return SimulatedBubbles(stages, pipeline.schedule(), m,
                          pipeline.chunks_per_worker(), pipeline.order_ticks());
}

// Each worker's utilization and bubble in the pipeline's last step (replica
// 0's; a worker of several chunks is busy for their busy time together)
// and the schedule's theory, as `gpipectl local` shows a cluster's, with
// the cut's bubble from the stages' measured times (the cost model's,
// `cut`, until they have them).
std::string PipelineFigures(InProcessPipeline& pipeline,
                            const std::vector<double>& cut) {
  const int64_t k = pipeline.worker_count();
  const int64_t v = pipeline.chunks_per_worker();
  if (k < 2) return "";
  std::vector<WorkerFigures> workers;
  for (int64_t w = 0; w < k; ++w) {
    double busy = 0, wall = 0;
    for (int64_t c = 0; c < v; ++c) {
      const StepTimeline last =
          pipeline.stage(StageOfChunk(pipeline.schedule(), k, w, c))
              .timeline()
              .LastStep();
      busy += last.busy_seconds();
      wall = std::max(wall, last.wall_seconds());
    }
    if (wall <= 0) return "";
    const double u = std::min(1.0, busy / wall);
    workers.push_back({u, 1.0 - u});
  }
  const int64_t m = ReplicaMicroBatches(pipeline);
  const std::vector<double> measured = MeasuredCutBubbles(pipeline);
  return StageFiguresLine(workers,
                          BubbleTheoryText(pipeline.schedule(), k, m, v,
                                           measured.empty() ? cut : measured));
}

}  // namespace

// The trainer the flags ask for: the reference trainer for one stage, the
// in-process pipeline otherwise.
// What this run holds at its peak by the memory model a worker and the
// controller check a job by: every stage's parameters, gradients, optimizer
// state and packed weights, the activations its schedule keeps, its working
// memory and its evaluation batch, for every stage at once (one process
// holds them all: Combined), once per replica. Past this process's memory
// (physical, its cgroups' or ulimit -v) a run would be killed partway with
// no word, or hang where a stage's thread ran out; parameters alone let a
// run through whose evaluation needed 128 GiB.
absl::Status CheckRunFits(const gpipe::v1::JobSpec& run,
                          const PipelineOptions& options) {
  ASSIGN_OR_RETURN(const ModelShapes shapes, InferModelShapes(run.model()));
  gpipe::v1::JobSpec est = run;
  gpipe::v1::PipelineSpec& p = *est.mutable_pipeline();
  p.set_stages(options.stages);
  p.set_schedule(ScheduleToSpec(options.schedule));
  p.set_remat(RematToSpec(options.remat));
  if (options.virtual_stages > 0) p.set_virtual_stages(options.virtual_stages);
  const int64_t chunks = options.stages * VirtualStageCount(est);
  // The cut the pipeline runs: --balance, else the spec's own for these
  // chunks (PartitionJob keeps it), else the partitioner's.
  std::vector<int64_t> balance = options.balance;
  if (static_cast<int64_t>(balance.size()) != chunks) {
    if (p.balance_size() != chunks) p.clear_balance();
    ASSIGN_OR_RETURN(balance, PartitionJob(est, chunks));
  }
  std::vector<StageMemory> stages =
      EstimatePipelineMemory(est, shapes, balance);
  // In one process a message is handed over, not copied by a transport.
  for (StageMemory& m : stages) m.in_flight = 0;
  const StageMemory all = Combined(stages);
  // Replicas past the first train, but only the first evaluates, and all
  // share the data set.
  const int64_t replicas = std::max<int64_t>(1, options.replicas);
  const int64_t one = all.total();
  const int64_t each =
      SaturatingSum({all.parameters, all.gradients, all.optimizer_state,
                     all.packed_weights, all.training(), all.batch});
  const int64_t more = replicas - 1 > 0 && each > INT64_MAX / (replicas - 1)
                           ? INT64_MAX
                           : each * (replicas - 1);
  const int64_t need = SaturatingSum({one, more});
  const int64_t have = SystemMemoryLimit();
  if (have > 0 && need > have) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this run needs about ", FormatBytes(need),
        replicas > 1
            ? absl::StrCat(" (", FormatBytes(one), " and ", replicas - 1,
                           " more replica", replicas > 2 ? "s" : "", " of ",
                           FormatBytes(each), ")")
            : "",
        ", more than the ", FormatBytes(have),
        " this machine lets the process use: ", all.ToString(),
        "; gpipectl plan shows what other batch, micro-batch and stage "
        "counts need"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Trainer>> MakeTrainer(
    const gpipe::v1::JobSpec& spec, int threads, std::string* description) {
  PipelineOptions options = OptionsFromSpec(spec);
  if (absl::GetFlag(FLAGS_stages) > 0)
    options.stages = absl::GetFlag(FLAGS_stages);
  if (absl::GetFlag(FLAGS_micro_batches) > 0)
    options.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  if (absl::GetFlag(FLAGS_virtual_stages) > 0)
    options.virtual_stages = absl::GetFlag(FLAGS_virtual_stages);
  if (absl::GetFlag(FLAGS_replicas) > 0)
    options.replicas = absl::GetFlag(FLAGS_replicas);
  if (!absl::GetFlag(FLAGS_schedule).empty()) {
    absl::StatusOr<ScheduleKind> s =
        ParseScheduleName(absl::GetFlag(FLAGS_schedule));
    if (!s.ok()) return s.status();
    options.schedule = *s;
  }
  if (absl::GetFlag(FLAGS_virtual_stages) > 0 &&
      !Interleaves(options.schedule)) {
    return absl::InvalidArgumentError(
        "--virtual-stages: only the interleaved and zb-v schedules hold "
        "several chunks per worker (--schedule interleaved or zb-v)");
  }
  if (!absl::GetFlag(FLAGS_remat).empty()) {
    absl::StatusOr<RematMode> r = ParseRematName(absl::GetFlag(FLAGS_remat));
    if (!r.ok()) return r.status();
    options.remat = *r;
  }
  const std::string balance = absl::GetFlag(FLAGS_balance);
  if (balance == "measured" && options.stages > 1) {
    // Profile each layer on one micro-batch, as a stage would run it.
    SetComputeThreads(
        std::max<int>(1, threads / static_cast<int>(options.stages)));
    auto seconds = MeasureLayerSeconds(
        spec, std::max<int64_t>(1, spec.batch_size() / options.micro_batches),
        3);
    if (!seconds.ok()) return seconds.status();
    // Measured forward and backward, without the recomputation that
    // re-materializing stages add: weighted for it. An interleaved
    // pipeline is cut into its stages' chunks.
    const int64_t chunks =
        options.stages *
        (Interleaves(options.schedule)
             ? ChunksPerWorker(options.schedule,
                               options.virtual_stages > 0
                                   ? options.virtual_stages
                                   : spec.pipeline().virtual_stages())
             : 1);
    auto parts = PartitionByCost(*seconds, chunks,
                                 RematStageWeights(options.remat, chunks));
    if (!parts.ok()) return parts.status();
    options.balance = *parts;
  } else if (!balance.empty() && balance != "measured") {
    for (absl::string_view part : absl::StrSplit(balance, ',')) {
      int64_t n = 0;
      if (!absl::SimpleAtoi(part, &n)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--balance: '", balance, "' is not a list of layer counts"));
      }
      options.balance.push_back(n);
    }
  }
  absl::StatusOr<Device> device = ResolveDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return device.status();
  // The R and M this run uses, in the spec both trainers read: the gradient
  // groups default to R, and the reference trainer must sum as the
  // pipeline does.
  gpipe::v1::JobSpec run = spec;
  run.mutable_pipeline()->set_replicas(options.replicas);
  run.mutable_pipeline()->set_micro_batches(options.micro_batches);
  if (*device == Device::kCpu) RETURN_IF_ERROR(CheckRunFits(run, options));
  if (options.stages == 1 && options.replicas <= 1) {
    SetComputeThreads(threads);
    *description = absl::StrCat(
        "reference trainer, ", options.micro_batches, " micro-batches, ",
        *device == Device::kCpu
            ? absl::StrCat(threads, threads == 1 ? " thread" : " threads")
            : absl::StrCat("on ", CudaDescription()));
    auto t =
        ReferenceTrainer::Create(run, options.micro_batches, nullptr, *device);
    if (!t.ok()) return t.status();
    return std::unique_ptr<Trainer>(std::move(*t));
  }
  options.threads_per_stage = std::max<int>(
      1, threads / static_cast<int>(options.stages * options.replicas));
  options.device = *device;
  auto p = InProcessPipeline::Create(run, options);
  if (!p.ok()) return p.status();
  *description = absl::StrCat(
      "in-process pipeline, K=", options.stages, " stages",
      (*p)->stage_count() > options.stages
          ? absl::StrCat(" of ", (*p)->stage_count() / options.stages,
                         " chunks each")
          : "",
      " (layers ", absl::StrJoin((*p)->balance(), "+"), ")",
      options.replicas > 1 ? absl::StrCat(" x ", options.replicas, " replicas")
                           : "",
      ", M=", options.micro_batches, ", ",
      std::string(ScheduleName(options.schedule)), ", remat ",
      std::string(RematName(options.remat)), ", ", options.threads_per_stage,
      options.threads_per_stage == 1 ? " thread" : " threads", " per stage",
      // At least one each: --threads 1 over 2 stages runs 2.
      options.threads_per_stage * options.stages * options.replicas > threads
          ? absl::StrCat(
                " (at least one each: ",
                options.threads_per_stage * options.stages * options.replicas,
                " for --threads ", threads, ")")
          : "",
      *device == Device::kCpu ? "" : ", on the GPU");
  return std::unique_ptr<Trainer>(std::move(*p));
}

int RunTrain(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr,
                 "usage: gpipectl train JOB.json [--stages K] "
                 "[--micro-batches M] [--schedule "
                 "gpipe|1f1b|zb-h1|interleaved|zb-v] [--virtual-stages V] "
                 "[--replicas R] "
                 "[--remat always|except_last|never] [--steps N] [--out DIR] "
                 "[--threads T] [--trace DIR] [--device cpu|cuda|auto]\n");
    return 2;
  }
  const int threads = absl::GetFlag(FLAGS_threads) > 0
                          ? absl::GetFlag(FLAGS_threads)
                          : gpipe::AvailableCores();
  // The flags go into the spec as `local` and `submit` put them, so the
  // model file records how the model was trained (it recorded the file's
  // micro-batches for a run of --micro-batches 8); its paths are absolute,
  // so they mean the same files wherever the file is used later (eval,
  // generate).
  absl::StatusOr<gpipe::v1::JobSpec> spec =
      LoadSpecWithFlags(args[0], /*measured_balance=*/true);
  if (!spec.ok()) return Fail(spec.status());
  std::string description;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      MakeTrainer(*spec, threads, &description);
  if (!trainer.ok()) return Fail(trainer.status());
  Trainer& t = **trainer;
  const std::string trace_dir = absl::GetFlag(FLAGS_trace);
  auto* pipeline = dynamic_cast<InProcessPipeline*>(&t);
  // The cut measured here is the one the model was trained under.
  if (absl::GetFlag(FLAGS_balance) == "measured" && pipeline != nullptr) {
    spec->mutable_pipeline()->mutable_balance()->Assign(
        pipeline->balance().begin(), pipeline->balance().end());
  }
  if (!trace_dir.empty() && pipeline == nullptr) {
    return Fail(absl::InvalidArgumentError(
        "--trace: the reference trainer (--stages 1) has no stages to trace; "
        "give --stages 2 or more"));
  }
  // Where the results go is made now: found after training, a bad path
  // lost the trained model.
  if (!trace_dir.empty()) {
    if (absl::Status s = MakeOutputDir("--trace", trace_dir); !s.ok())
      return Fail(s);
  }
  if (const std::string out = absl::GetFlag(FLAGS_out); !out.empty()) {
    if (absl::Status s = MakeOutputDir("--out", out); !s.ok()) return Fail(s);
  }
  const bool classification =
      spec->model().input().dtype() == gpipe::v1::FLOAT32;
  std::printf("training %s: %lld steps, batch %lld; %s\n",
              spec->name().empty() ? args[0].c_str() : spec->name().c_str(),
              static_cast<long long>(spec->steps()),
              static_cast<long long>(spec->batch_size()), description.c_str());
  if (spec->has_init_from()) {
    std::printf("init_from %s: %s%s\n", spec->init_from().path().c_str(),
                t.init_summary().c_str(),
                t.step() > 0
                    ? absl::StrCat("; continuing from step ", t.step()).c_str()
                    : "");
  }
  // The in-process trainer keeps no checkpoints: said, where the spec asks
  // for them (they were skipped in silence, and a Ctrl-C lost the run).
  if (spec->checkpoint().every() > 0) {
    std::printf(
        "note: checkpoint.every %lld is for jobs on a cluster (gpipectl "
        "local, submit); train keeps no checkpoints, and Ctrl-C stops after "
        "the step under way%s\n",
        static_cast<long long>(spec->checkpoint().every()),
        absl::GetFlag(FLAGS_out).empty()
            ? ""
            : " and writes the model of the step reached to --out");
  }
  std::fflush(stdout);

  const absl::Time start = absl::Now();
  InterruptCatcher catcher;
  // A run continued from a checkpoint's step counts only its own steps
  // (it printed the checkpoint's 6200 steps as trained in 0.0 s).
  const int64_t first_step = t.step();
  {
    Progress progress(spec->steps(), stderr, first_step);
    const StepPlan plan = StepPlan::FromSpec(*spec);
    // The bubble the cost model predicts for the pipeline's cut, beside
    // the schedule's theory, until the stages have measured theirs: once,
    // the cut does not change.
    std::vector<double> cut;
    if (pipeline != nullptr && pipeline->worker_count() > 1) {
      cut = CutBubbles(
          *spec, pipeline->schedule(), pipeline->remat(), pipeline->balance(),
          ReplicaMicroBatches(*pipeline), pipeline->chunks_per_worker(),
          spec->batch_size() / std::max<int64_t>(1, pipeline->replica_count()));
    }
    while (t.step() < spec->steps()) {
      absl::StatusOr<StepReport> r = t.Step();
      if (!r.ok()) {
        progress.Finish();
        return Fail(r.status());
      }
      if (pipeline != nullptr)
        progress.SetSuffix(PipelineFigures(*pipeline, cut));
      progress.Update(t.step(), r->loss, t.step() * spec->batch_size());
      if (interrupted && t.step() < spec->steps()) break;
      if (plan.EvaluatesAfter(t.step())) {
        progress.Finish();
        absl::StatusOr<EvalResult> e =
            t.Evaluate(Split::kTest, spec->eval().max_samples());
        if (!e.ok()) return Fail(e.status());
        PrintEval(absl::StrCat("step ", t.step()).c_str(), *e, classification);
      }
    }
  }
  if (interrupted && t.step() < spec->steps()) {
    // What the run reached is kept: the model file records its step, so
    // eval, predict and an init_from (without optimizer state) take it.
    const std::string out = absl::GetFlag(FLAGS_out);
    std::printf("interrupted at step %lld of %lld",
                static_cast<long long>(t.step()),
                static_cast<long long>(spec->steps()));
    if (!out.empty()) {
      absl::Status s = WriteModel(t, *spec, out);
      if (!s.ok()) return Fail(s);
      std::printf("; wrote the model of step %lld to %s/model.safetensors",
                  static_cast<long long>(t.step()), out.c_str());
    }
    std::printf("\n");
    return 130;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const int64_t ran = t.step() - first_step;
  std::printf("trained %lld steps in %.1fs (%.0f samples/s)\n",
              static_cast<long long>(ran), seconds,
              seconds > 0 ? ran * spec->batch_size() / seconds : 0.0);
  // The model and the trace first, the final evaluation last: a Ctrl-C
  // while they are written is held until they are whole, and one during
  // the evaluation ends it at once with nothing lost (it was swallowed,
  // and the evaluation and the write went on).
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    absl::Status s = WriteModel(t, *spec, out);
    if (!s.ok()) return Fail(s);
    std::printf("wrote %s/model.safetensors\n", out.c_str());
  }
  if (!trace_dir.empty()) {
    absl::Status s = WritePipelineTrace(*pipeline, *spec, trace_dir);
    if (!s.ok()) return Fail(s);
    std::printf("wrote %s\n", TraceDirFiles(trace_dir).c_str());
  }
  std::fflush(stdout);
  // A Ctrl-C from here on ends the process; one before only set the flag.
  catcher.Release();
  if (interrupted) {
    std::printf("interrupted: the final evaluation was skipped\n");
    return 130;
  }
  absl::StatusOr<EvalResult> e =
      t.Evaluate(Split::kTest, spec->eval().max_samples());
  if (!e.ok()) return Fail(e.status());
  PrintEval("final", *e, classification);
  return 0;
}

}  // namespace gpipe::cli
