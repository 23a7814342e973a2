// gpipectl generate MODEL.safetensors --prompt TEXT: samples a language
// model's continuation token by token (Generator: a key/value cache, a
// forward of one position per token), streaming it as it comes. Text
// models map bytes through the vocabulary their file records; token-id
// models take and print ids. --stages K serves the model as K stages (the
// partition training would use), --device cuda on the GPU.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "services/core/cores.h"
#include "services/core/status.h"
#include "services/nn/generator.h"
#include "services/nn/model.h"
#include "services/pipeline/data_resolution.h"
#include "services/pipeline/init_weights.h"
#include "services/pipeline/model_file.h"
#include "services/pipeline/partitioner.h"
#include "services/tensor/device.h"
#include "services/tensor/threads.h"

ABSL_FLAG(std::string, prompt, "",
          "generate: the text to continue (token ids, separated by spaces or "
          "commas, for a model of token ids)");
ABSL_FLAG(int64_t, tokens, 200, "generate: how many tokens to sample");
ABSL_FLAG(double, temperature, 1.0,
          "generate: sampling temperature; 0: always the most likely token");
ABSL_FLAG(int64_t, top_k, 0,
          "generate: sample among the k most likely tokens (0: all)");
ABSL_FLAG(uint64_t, seed, 0,
          "generate: the sampling seed (same seed, same text)");
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(int64_t, stages);
ABSL_DECLARE_FLAG(std::string, device);

namespace gpipe::cli {
namespace {

// Every error in the served model's words (ServedModelError): the user
// wrote no init_from.
int Fail(const absl::Status& status) {
  return FailCommand("generate", ServedModelError(status));
}

// Token ids written as text: "12 7 300" or "12,7,300", each one of the
// model's `vocab` ids. Checked before anything is printed: a prompt past
// the vocabulary was echoed, then refused.
absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text,
                                              int64_t vocab) {
  std::vector<int32_t> ids;
  for (absl::string_view part :
       absl::StrSplit(text, absl::ByAnyChar(", \t\n"), absl::SkipEmpty())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt: \"", part,
          "\" is not a token id (this model reads token ids, not text)"));
    }
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt: token id ", part, " is not one of the model's ", vocab,
          " ids (0 to ", vocab - 1, ")"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// The model file's parameters in `k` stages (the partition a k-stage job
// would use), each a Model of its layers only, loaded from the file by
// name, on `device`.
absl::StatusOr<std::vector<std::unique_ptr<Model>>> LoadStages(
    const gpipe::v1::JobSpec& spec, int64_t k, Device device) {
  std::vector<int64_t> balance = {spec.model().layers_size()};
  if (k > 1) {
    ASSIGN_OR_RETURN(balance, PartitionJobAt(spec, k));
  }
  const std::vector<int64_t> begins = StageBegins(balance);
  ASSIGN_OR_RETURN(const InitWeights weights,
                   ReadInitWeights(spec.init_from().path()));
  std::vector<std::unique_ptr<Model>> stages;
  for (size_t s = 0; s < balance.size(); ++s) {
    const int64_t begin = begins[s], end = begins[s] + balance[s];
    ASSIGN_OR_RETURN(std::unique_ptr<Model> stage,
                     Model::Build(spec.model(), spec.seed(), begin, end));
    RETURN_IF_ERROR(
        LoadInitWeights(weights, spec.init_from(), stage->StateTensors(), {},
                        LayerRange{begin, end, spec.model().layers_size()})
            .status());
    RETURN_IF_ERROR(stage->To(device));
    stages.push_back(std::move(stage));
  }
  return stages;
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr,
                 "usage: gpipectl generate MODEL.safetensors --prompt TEXT "
                 "[--tokens N] [--temperature T] [--top_k K] [--seed S] "
                 "[--stages K] [--device cpu|cuda]\n");
    return 2;
  }
  absl::StatusOr<gpipe::v1::JobSpec> spec = SpecToServe(args[0], "");
  if (!spec.ok()) return Fail(spec.status());
  SetComputeThreads(absl::GetFlag(FLAGS_threads) > 0
                        ? absl::GetFlag(FLAGS_threads)
                        : gpipe::AvailableCores());
  const gpipe::v1::DataSpec& data = spec->data();
  std::string vocabulary = data.text().vocabulary();
  if (data.has_text() && vocabulary.empty()) {
    // A file written before vocabularies were recorded: the text it was
    // trained on says the same, if it is still there.
    gpipe::v1::JobSpec resolved = *spec;
    if (absl::Status s = ResolveDataDependentFields(&resolved); !s.ok()) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          args[0], " records no vocabulary and its text cannot be read (",
          s.message(), ")")));
    }
    vocabulary = resolved.data().text().vocabulary();
  }
  // Said before the prompt is read: a classifier's prompt was refused as
  // "not a token id", which pointed at the prompt rather than the model.
  if (spec->model().layers_size() == 0 ||
      !spec->model().layers(0).has_embedding()) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        args[0],
        ": generation needs a language model (an embedding of token "
        "ids first); this model's input is ",
        gpipe::v1::DType_Name(spec->model().input().dtype()), " [",
        absl::StrJoin(spec->model().input().shape().dims(), ", "), "]")));
  }
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  std::vector<int32_t> ids;
  if (data.has_text()) {
    int32_t id_of[256];
    std::fill(std::begin(id_of), std::end(id_of), -1);
    for (size_t i = 0; i < vocabulary.size(); ++i) {
      id_of[static_cast<uint8_t>(vocabulary[i])] = static_cast<int32_t>(i);
    }
    for (size_t i = 0; i < prompt.size(); ++i) {
      const int32_t id = id_of[static_cast<uint8_t>(prompt[i])];
      if (id < 0) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("--prompt: byte ", static_cast<uint8_t>(prompt[i]),
                         " ('", prompt.substr(i, 1), "') at offset ", i,
                         " is not in the model's vocabulary of ",
                         vocabulary.size(), " bytes")));
      }
      ids.push_back(id);
    }
  } else {
    const gpipe::v1::ModelSpec& model = spec->model();
    const int64_t vocab =
        model.layers_size() > 0 && model.layers(0).has_embedding()
            ? model.layers(0).embedding().vocab_size()
            : 0;
    absl::StatusOr<std::vector<int32_t>> parsed = ParseIds(prompt, vocab);
    if (!parsed.ok()) return Fail(parsed.status());
    ids = std::move(*parsed);
  }
  if (ids.empty()) {
    return Fail(
        absl::InvalidArgumentError("--prompt: required (one token at least)"));
  }

  absl::StatusOr<Device> device = ResolveDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) return Fail(device.status());
  absl::StatusOr<std::vector<std::unique_ptr<Model>>> stages = LoadStages(
      *spec, std::max<int64_t>(absl::GetFlag(FLAGS_stages), 1), *device);
  if (!stages.ok()) return Fail(stages.status());
  std::vector<Model*> parts;
  for (const std::unique_ptr<Model>& m : *stages) parts.push_back(m.get());
  absl::StatusOr<std::unique_ptr<Generator>> generator =
      Generator::Create(std::move(parts));
  if (!generator.ok()) return Fail(generator.status());

  SamplingOptions options;
  options.tokens = absl::GetFlag(FLAGS_tokens);
  options.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  options.top_k = absl::GetFlag(FLAGS_top_k);
  options.seed = absl::GetFlag(FLAGS_seed);
  if (data.has_text()) {
    options.vocabulary = static_cast<int64_t>(vocabulary.size());
  }
  if (options.tokens < 0 || !(options.temperature >= 0)) {
    return Fail(absl::InvalidArgumentError(
        "--tokens and --temperature must not be negative"));
  }
  const bool text = data.has_text();
  // Ids are echoed as they are generated: space-separated, whatever
  // separated the prompt's.
  if (text)
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  else
    std::printf("%s", absl::StrJoin(ids, " ").c_str());
  std::fflush(stdout);
  absl::StatusOr<std::vector<int32_t>> out =
      (*generator)->Generate(ids, options, [&](int32_t id) {
        if (text) {
          std::fputc(static_cast<uint8_t>(vocabulary[id]), stdout);
        } else {
          std::printf(" %d", id);
        }
        std::fflush(stdout);
      });
  std::printf("\n");
  if (!out.ok()) return Fail(out.status());
  return 0;
}

}  // namespace gpipe::cli
