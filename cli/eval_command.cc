// gpipectl eval MODEL.safetensors [JOB.json]: the loss and accuracy of a
// trained model on a split of its own data (the job in the file's metadata)
// or of another job's data, computed as the training run computed its
// evaluation: the same trainer for the same flags, so the same figures.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "services/core/cores.h"
#include "services/core/status.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/model_file.h"
#include "services/pipeline/trainer.h"

ABSL_FLAG(std::string, split, "test",
          "eval: the split to evaluate, test or train");
ABSL_FLAG(int64_t, max_samples, -1,
          "eval: at most this many samples (-1: the job's eval.max_samples; "
          "0: the whole split)");
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(int, threads);

namespace gpipe::cli {
namespace {

// Every error in the served model's words (ServedModelError): the user
// wrote no init_from.
int Fail(const absl::Status& status) {
  return FailCommand("eval", ServedModelError(status));
}

}  // namespace

int RunEval(const std::vector<std::string>& args) {
  if (args.empty() || args.size() > 2) {
    std::fprintf(stderr,
                 "usage: gpipectl eval MODEL.safetensors [JOB.json] "
                 "[--split test|train] [--max_samples N] [--stages K] "
                 "[--micro_batches M] [--threads T] [--device cpu|cuda] "
                 "[--json]\n");
    return 2;
  }
  const std::string split_name = absl::GetFlag(FLAGS_split);
  if (split_name != "test" && split_name != "train") {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--split: \"", split_name, "\" is neither test nor train")));
  }
  const Split split = split_name == "test" ? Split::kTest : Split::kTrain;
  absl::StatusOr<gpipe::v1::JobSpec> spec =
      SpecToServe(args[0], args.size() == 2 ? args[1] : "");
  if (!spec.ok()) return Fail(spec.status());
  const int64_t max_samples = absl::GetFlag(FLAGS_max_samples) >= 0
                                  ? absl::GetFlag(FLAGS_max_samples)
                                  : spec->eval().max_samples();
  const int threads = absl::GetFlag(FLAGS_threads) > 0
                          ? absl::GetFlag(FLAGS_threads)
                          : gpipe::AvailableCores();
  std::string description;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      MakeTrainer(*spec, threads, &description);
  if (!trainer.ok()) return Fail(trainer.status());
  absl::StatusOr<EvalResult> e = (*trainer)->Evaluate(split, max_samples);
  if (!e.ok()) return Fail(e.status());
  const bool classification =
      spec->model().input().dtype() == gpipe::v1::FLOAT32;
  if (absl::GetFlag(FLAGS_json)) {
    // Every digit: a script compares these with a training run's.
    std::printf(
        "{\"split\": \"%s\", \"loss\": %.17g, \"accuracy\": %.17g, "
        "\"counted\": %lld}\n",
        split_name.c_str(), e->loss, e->accuracy,
        static_cast<long long>(e->counted));
    return 0;
  }
  std::printf("%s (%s)\n", args[0].c_str(), description.c_str());
  std::printf("%s loss %.4f, %s %saccuracy %.4f (%lld targets)\n",
              split_name.c_str(), e->loss, split_name.c_str(),
              classification ? "" : "token ", e->accuracy,
              static_cast<long long>(e->counted));
  return 0;
}

}  // namespace gpipe::cli
