// gpipectl train JOB.json: the single-process reference trainer, with a
// progress bar, a final evaluation and optional safetensors output.
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cli/commands.h"
#include "google/protobuf/util/json_util.h"
#include "services/core/progress.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/reference_trainer.h"
#include "services/storage/safetensors.h"
#include "services/tensor/threads.h"

ABSL_FLAG(int64_t, micro_batches, 0,
          "micro-batches per mini-batch (0: the job spec's)");
ABSL_FLAG(int64_t, steps, 0, "training steps (0: the job spec's)");
ABSL_FLAG(std::string, out, "",
          "directory for model.safetensors with the final parameters");
ABSL_FLAG(int, threads, 0, "compute threads (0: all cores)");

namespace gpipe::cli {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "gpipectl train: %s\n",
               std::string(status.message()).c_str());
  return 1;
}

void PrintEval(const char* when, const EvalResult& e, bool classification) {
  std::printf("%s: test loss %.4f", when, e.loss);
  if (classification) std::printf(", test accuracy %.4f", e.accuracy);
  else std::printf(", test token accuracy %.4f", e.accuracy);
  std::printf(" (%lld targets)\n", static_cast<long long>(e.counted));
  std::fflush(stdout);
}

absl::Status WriteModel(ReferenceTrainer& trainer, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("--out: cannot create ", dir, ": ", ec.message()));
  }
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const NamedTensor& t : trainer.model().StateTensors())
    tensors.emplace_back(t.name, t.tensor);
  std::string spec_json;
  (void)google::protobuf::util::MessageToJsonString(trainer.spec(), &spec_json);
  return WriteSafetensors(dir + "/model.safetensors", tensors,
                          {{"format", "pt"},
                           {"gpipe.step", absl::StrCat(trainer.step())},
                           {"gpipe.job", spec_json}});
}

}  // namespace

int RunTrain(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr, "usage: gpipectl train JOB.json [--micro-batches M] "
                         "[--steps N] [--out DIR] [--threads T]\n");
    return 2;
  }
  const int threads = absl::GetFlag(FLAGS_threads);
  SetComputeThreads(threads > 0 ? threads
                                : static_cast<int>(std::thread::hardware_concurrency()));
  absl::StatusOr<gpipe::v1::JobSpec> spec = LoadJobSpecFile(args[0]);
  if (!spec.ok()) return Fail(spec.status());
  if (absl::GetFlag(FLAGS_steps) > 0) spec->set_steps(absl::GetFlag(FLAGS_steps));
  auto trainer = ReferenceTrainer::Create(*spec, absl::GetFlag(FLAGS_micro_batches));
  if (!trainer.ok()) return Fail(trainer.status());
  ReferenceTrainer& t = **trainer;
  const bool classification = spec->model().input().shape().dims_size() > 0 &&
                              t.dataset().target_shape().rank() == 0;
  std::printf("training %s: %lld steps, batch %lld, %lld micro-batches, %d threads\n",
              spec->name().empty() ? args[0].c_str() : spec->name().c_str(),
              static_cast<long long>(spec->steps()),
              static_cast<long long>(spec->batch_size()),
              static_cast<long long>(t.micro_batches()), ComputeThreads());
  std::fflush(stdout);

  const absl::Time start = absl::Now();
  {
    Progress progress(spec->steps());
    const int64_t every = spec->eval().every();
    while (t.step() < spec->steps()) {
      absl::StatusOr<StepReport> r = t.Step();
      if (!r.ok()) {
        progress.Finish();
        return Fail(r.status());
      }
      progress.Update(t.step(), r->loss, t.step() * spec->batch_size());
      if (every > 0 && t.step() % every == 0 && t.step() < spec->steps()) {
        progress.Finish();
        PrintEval(absl::StrCat("step ", t.step()).c_str(),
                  t.Evaluate(Split::kTest, spec->eval().max_samples()),
                  classification);
      }
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf("trained %lld steps in %.1fs (%.0f samples/s)\n",
              static_cast<long long>(t.step()), seconds,
              t.step() * spec->batch_size() / seconds);
  PrintEval("final", t.Evaluate(Split::kTest, spec->eval().max_samples()),
            classification);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    absl::Status s = WriteModel(t, out);
    if (!s.ok()) return Fail(s);
    std::printf("wrote %s/model.safetensors\n", out.c_str());
  }
  return 0;
}

}  // namespace gpipe::cli
