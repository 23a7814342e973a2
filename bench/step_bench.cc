// step_bench: milliseconds per training step of the reference trainer on a
// job spec, and the training GFLOP/s that makes, as a share of the sgemm
// peak measured in the same run. With --profile, also where a step's time
// goes, layer by layer.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/args.h"
#include "bench/peak.h"
#include "bench/step_profile.h"
#include "bench/timing.h"
#include "services/core/cores.h"
#include "services/core/memory.h"
#include "services/nn/layer_spec.h"
#include "services/nn/optimizer.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/reference_trainer.h"
#include "services/tensor/cpu/gemm.h"
#include "services/tensor/threads.h"

namespace gpipe::bench {
namespace {

constexpr char kUsage[] =
    "usage: step_bench SPEC.json [--steps N] [--warmup W] [--threads T]\n"
    "                  [--micro-batches M] [--profile] [--glibc-malloc]\n"
    "  --steps N          timed steps (default 20)\n"
    "  --warmup W         untimed steps first (default 3)\n"
    "  --threads T        compute threads (default: the usable cores)\n"
    "  --micro-batches M  micro-batches per step (default: the spec's)\n"
    "  --profile          then time 5 more steps piece by piece, layer by "
    "layer\n"
    "  --glibc-malloc     leave glibc's malloc as it is (the product's "
    "processes keep\n"
    "                     freed memory: KeepFreedMemory)\n";

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "(unset)";
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "step_bench: %s\n", message.c_str());
  return 1;
}

// Minor page faults of this process so far: first touches of fresh pages,
// which a steady-state step should not have.
int64_t MinorPageFaults() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

int Run(const Args& args) {
  const std::string path = args.positional()[0];
  const long steps = std::max(1L, args.Int("steps", 20));
  const long warmup = std::max(0L, args.Int("warmup", 3));
  const long threads_flag = args.Int("threads", 0);
  const int threads = threads_flag > 0 ? static_cast<int>(threads_flag)
                                       : gpipe::AvailableCores();
  SetComputeThreads(threads);

  absl::StatusOr<gpipe::v1::JobSpec> spec = LoadJobSpecFile(path);
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  // The schedule only needs to cover the steps we take.
  spec->set_steps(std::max<int64_t>(spec->steps(), warmup + steps + 10));
  absl::StatusOr<ModelShapes> shapes = InferModelShapes(spec->model());
  if (!shapes.ok()) return Fail(std::string(shapes.status().message()));
  double forward_flops = 0.0;  // per sample
  for (const LayerCost& c : shapes->costs) forward_flops += c.forward_flops;
  auto trainer = ReferenceTrainer::Create(*spec, args.Int("micro-batches", 0));
  if (!trainer.ok()) return Fail(std::string(trainer.status().message()));
  ReferenceTrainer& t = **trainer;

  std::printf("step_bench: %s (%s)\n",
              spec->name().empty() ? "unnamed" : spec->name().c_str(),
              path.c_str());
  std::printf(
      "  batch %lld in %lld micro-batches, --threads %d, %ld warm-up + "
      "%ld timed steps\n",
      static_cast<long long>(spec->batch_size()),
      static_cast<long long>(t.micro_batches()), threads, warmup, steps);
  int64_t parameters = 0;
  for (const NamedParameter& p : t.model().Parameters())
    parameters += p.param->value.numel();
  std::printf("  model: %lld layers, %lld parameters\n",
              static_cast<long long>(t.model().size()),
              static_cast<long long>(parameters));
  std::printf(
      "  GEMM tile %s; OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s (the "
      "cblas_sgemm yardstick's)\n",
      cpu::GemmKernelName(), Env("OPENBLAS_CORETYPE"), Env("OPENBLAS_L2_SIZE"));
  std::fflush(stdout);

  const SgemmPeak peak = MeasureSgemmPeak(threads);
  const TilePeak tile = MeasureTilePeak(threads);
  const TriadBandwidth triad = MeasureTriad();
  for (long s = 0; s < warmup; ++s) {
    absl::StatusOr<StepReport> r = t.Step();
    if (!r.ok()) return Fail(std::string(r.status().message()));
  }
  // After a step, so that whatever the library sets on first use is in place.
  std::printf("  ComputeThreads() %d during the timed steps\n",
              ComputeThreads());
  if (ComputeThreads() != threads) {
    std::printf(
        "warning: SetComputeThreads(%d) left ComputeThreads() at %d: "
        "our kernels and GEMM panels run on %d thread(s)\n",
        threads, ComputeThreads(), ComputeThreads());
  }
  std::vector<double> ms;
  const int64_t faults_before = MinorPageFaults();
  for (long s = 0; s < steps; ++s) {
    absl::Status status;
    ms.push_back(1e3 * TimeSeconds([&] { status = t.Step().status(); }));
    if (!status.ok()) return Fail(std::string(status.message()));
  }
  const double faults =
      static_cast<double>(MinorPageFaults() - faults_before) / steps;
  const double median = Median(ms), mean = Mean(ms);
  std::printf("ms/step: median %.3f  mean %.3f  min %.3f  max %.3f\n", median,
              mean, *std::min_element(ms.begin(), ms.end()),
              *std::max_element(ms.begin(), ms.end()));
  std::printf(
      "page faults per step: %.1f (%s)\n", faults,
      args.Has("glibc-malloc")
          ? "glibc's malloc defaults: large blocks come from fresh pages"
          : "the heap keeps freed memory, as gpipectl and gpipe-worker do");
  const double step_flops = 3.0 * forward_flops * spec->batch_size();
  const double gflops = step_flops / (median * 1e-3) / 1e9;
  std::printf(
      "training FLOPs: 3 x forward (forward + 2x for backward) = 3 x "
      "%.3f MFLOP/sample x %lld = %.1f MFLOP/step\n",
      forward_flops / 1e6, static_cast<long long>(spec->batch_size()),
      step_flops / 1e6);
  std::printf(
      "achieved: %.2f GFLOP/s at the median step = %.1f%% of the "
      "cblas_sgemm peak, %.1f%% of our tile's peak\n",
      gflops, 100.0 * gflops / peak.gflops, 100.0 * gflops / tile.gflops);
  std::printf(
      "peak: cblas_sgemm %lld^3 on %d OpenBLAS threads, best of %d: "
      "%.1f GFLOP/s (this run)\n",
      static_cast<long long>(peak.size), peak.threads, peak.reps, peak.gflops);
  std::printf(
      "tile peak: our %s GEMM tile on data in L1, %d thread(s): %.1f GFLOP/s "
      "(this run)\n",
      tile.tile, tile.threads, tile.gflops);
  std::printf(
      "memory: a triad over 3 x %lld MiB on %d thread(s), best of 5: %.1f "
      "GB/s (this run)\n",
      static_cast<long long>(triad.floats * 4 >> 20), triad.threads,
      triad.gbytes_per_s);
  std::printf(
      "note: a step includes taking its batch (gathered from the dataset "
      "in memory on a thread\n      of its own while the step before ran), "
      "the forward and backward of every\n      micro-batch, clipping "
      "(when the job clips) and the optimizer update.\n");
  std::fflush(stdout);

  if (args.Has("profile")) {
    const StepProfile profile = ProfileSteps(t, 5);
    PrintProfile(profile);
    // The update's memory traffic per parameter: the gradient norm, when
    // the job clips, reads the gradient (4 bytes), the update reads the
    // gradient and reads and writes the weight and each state tensor,
    // zeroing writes the gradient.
    const gpipe::v1::OptimizerSpec& o = spec->optimizer();
    const int states = o.has_adamw() ? 2 : (o.sgd().momentum() != 0 ? 1 : 0);
    const double norm_bytes = ClipsGradients(o) ? 4.0 : 0.0;
    const double bytes =
        (norm_bytes + 4.0 + 8.0 + 8.0 * states + 4.0) * parameters;
    // The element-wise layers stream their tensors once: a forward reads
    // its input and writes its output (8 bytes an element), a backward
    // reads the output's gradient and what the forward kept and writes the
    // input's gradient (12; dropout, which keeps nothing, 8).
    std::printf(
        "\nelement-wise layers against the triad (%.1f GB/s), the least "
        "traffic each pass must move:\n",
        triad.gbytes_per_s);
    std::printf("  %-32s %12s %14s %12s %14s\n", "layer", "fwd GB/s",
                "fwd of triad", "bwd GB/s", "bwd of triad");
    for (const StepProfile::Part& part : profile.parts) {
      if (part.layer < 0) continue;
      const std::string kind(LayerKindName(spec->model().layers(part.layer)));
      if (kind != "relu" && kind != "tanh" && kind != "gelu" &&
          kind != "dropout" && kind != "layer_norm") {
        continue;
      }
      if (shapes->costs[part.layer].output_is_input) continue;  // a view
      const double elements =
          static_cast<double>(shapes->outputs[part.layer].numel()) *
          spec->batch_size();
      const double fwd = 8 * elements / (part.forward_ms * 1e-3) / 1e9;
      const double bwd = (kind == "dropout" ? 8 : 12) * elements /
                         (part.backward_ms * 1e-3) / 1e9;
      std::printf("  %-32s %12.1f %13.0f%% %12.1f %13.0f%%\n",
                  part.name.c_str(), fwd, 100 * fwd / triad.gbytes_per_s, bwd,
                  100 * bwd / triad.gbytes_per_s);
    }
    for (const StepProfile::Part& part : profile.parts) {
      if (part.name != kUpdatePart) continue;
      const double gbs = bytes / (part.forward_ms * 1e-3) / 1e9;
      std::printf(
          "\nthe update moves %.1f MB a step (%lld parameters, %d state "
          "tensor(s); a clip's rescale, when it scales, not counted): "
          "%.1f GB/s = %.0f%% of the triad\n",
          bytes / 1e6, static_cast<long long>(parameters), states, gbs,
          100.0 * gbs / triad.gbytes_per_s);
    }
  }
  return 0;
}

}  // namespace
}  // namespace gpipe::bench

int main(int argc, char** argv) {
  using gpipe::bench::Args;
  const Args args(argc, argv, {"steps", "warmup", "threads", "micro-batches"},
                  {"profile", "glibc-malloc"});
  if (!args.ok() || args.positional().size() != 1) {
    std::fprintf(stderr, "step_bench: %s\n%s",
                 args.ok() ? "expected one SPEC.json" : args.error().c_str(),
                 gpipe::bench::kUsage);
    return 2;
  }
  // The processes that train (gpipectl, gpipe-worker) keep freed memory in
  // the heap; measured the same way unless asked otherwise.
  if (!args.Has("glibc-malloc")) gpipe::KeepFreedMemory();
  return gpipe::bench::Run(args);
}
