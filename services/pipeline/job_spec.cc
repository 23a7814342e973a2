#include "services/pipeline/job_spec.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/data/normalize.h"
#include "services/data/synthetic.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/data_resolution.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/spec_json_check.h"
#include "services/tensor/shape.h"

namespace gpipe {
namespace {

namespace v1 = ::gpipe::v1;

template <typename... Args>
absl::Status FieldError(std::string_view path, const Args&... args) {
  return absl::InvalidArgumentError(
      absl::StrCat(AsAbsl(path), ": ", AsAbsl(args)...));
}

absl::Status CheckPositive(std::string_view path, int64_t v) {
  if (v <= 0) return FieldError(path, "must be positive, got ", v);
  return absl::OkStatus();
}

absl::Status CheckNonNegative(std::string_view path, int64_t v) {
  if (v < 0) return FieldError(path, "must be >= 0, got ", v);
  return absl::OkStatus();
}

// Written so that NaN fails every check.
absl::Status CheckNonNegative(std::string_view path, float v) {
  if (!(v >= 0) || !std::isfinite(v)) {
    return FieldError(path, "must be >= 0 and finite, got ", v);
  }
  return absl::OkStatus();
}

absl::Status CheckFraction(std::string_view path, float v) {
  if (!(v >= 0 && v < 1)) return FieldError(path, "must be in [0, 1), got ", v);
  return absl::OkStatus();
}

// A data source's test split: 0 is the default, as when the field is left
// out (proto3 cannot tell them apart), so the message says so.
absl::Status CheckTestFraction(std::string_view path, float v) {
  if (!(v >= 0 && v < 1)) {
    return FieldError(path, "must be in [0, 1) (0 means the default 0.1), got ",
                      v);
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const v1::OptimizerSpec& o) {
  if (!(o.lr() > 0) || !std::isfinite(o.lr())) {
    return FieldError("optimizer.lr", "must be positive and finite, got ",
                      o.lr());
  }
  switch (o.kind_case()) {
    case v1::OptimizerSpec::kSgd:
      RETURN_IF_ERROR(
          CheckFraction("optimizer.sgd.momentum", o.sgd().momentum()));
      RETURN_IF_ERROR(CheckNonNegative("optimizer.sgd.weight_decay",
                                       o.sgd().weight_decay()));
      break;
    case v1::OptimizerSpec::kAdamw: {
      const v1::AdamW& a = o.adamw();
      if (a.has_beta1()) {
        RETURN_IF_ERROR(CheckFraction("optimizer.adamw.beta1", a.beta1()));
      }
      if (a.has_beta2()) {
        RETURN_IF_ERROR(CheckFraction("optimizer.adamw.beta2", a.beta2()));
      }
      if (a.has_eps() && (!(a.eps() > 0) || !std::isfinite(a.eps()))) {
        return FieldError("optimizer.adamw.eps", "must be positive, got ",
                          a.eps());
      }
      if (a.has_weight_decay()) {
        RETURN_IF_ERROR(
            CheckNonNegative("optimizer.adamw.weight_decay", a.weight_decay()));
      }
      break;
    }
    case v1::OptimizerSpec::KIND_NOT_SET:
      return FieldError("optimizer",
                        "no optimizer set (expected sgd or adamw)");
  }
  RETURN_IF_ERROR(CheckNonNegative("optimizer.clip_norm", o.clip_norm()));
  RETURN_IF_ERROR(CheckNonNegative("optimizer.warmup_steps", o.warmup_steps()));
  if (!v1::LrDecay_IsValid(o.decay())) {
    return FieldError("optimizer.decay", "unknown value ",
                      static_cast<int>(o.decay()));
  }
  if (!v1::WeightDecayOn_IsValid(o.weight_decay_on())) {
    return FieldError("optimizer.weight_decay_on", "unknown value ",
                      static_cast<int>(o.weight_decay_on()));
  }
  RETURN_IF_ERROR(CheckNonNegative("optimizer.min_lr", o.min_lr()));
  // The decay goes from lr down to min_lr: above lr it would climb, which
  // is a typo (a min_lr of 10 for an lr of 0.01 trained to a loss of 69).
  if (o.decay() != v1::LR_DECAY_NONE && o.min_lr() > o.lr()) {
    return FieldError("optimizer.min_lr", o.min_lr(), " is above lr ", o.lr(),
                      " (the decay goes from lr down to min_lr)");
  }
  return absl::OkStatus();
}

// What the data source produces, as the model must see it.
struct ModelEnds {
  v1::DType input_dtype;
  Shape input;
  Shape output;
};

std::string Describe(v1::DType dtype, const Shape& shape) {
  return absl::StrCat(v1::DType_Name(dtype), " ", shape.ToString());
}

absl::Status ValidateFashionMnist(const ModelEnds& m) {
  const bool image = m.input == Shape{1, 28, 28} || m.input == Shape{784};
  if (m.input_dtype != v1::FLOAT32 || !image) {
    return FieldError("data.fashion_mnist",
                      "needs a model input of FLOAT32 [1, 28, 28] or [784], "
                      "got ",
                      Describe(m.input_dtype, m.input));
  }
  if (m.output != Shape{10}) {
    return FieldError("data.fashion_mnist",
                      "needs a model output of [10] classes, got ",
                      m.output.ToString());
  }
  return absl::OkStatus();
}

// COPY and REVERSE: `length` symbols, a separator, `length` symbols. The
// model reads the first 2*length tokens and predicts the next one at each
// position, over the symbols plus the separator.
absl::Status ValidateSequenceTask(const v1::Synthetic& s,
                                  const v1::ModelSpec& model,
                                  const ModelEnds& m) {
  RETURN_IF_ERROR(CheckPositive("data.synthetic.vocab_size", s.vocab_size()));
  if (s.vocab_size() >= kMaxSpecSize) {
    return FieldError("data.synthetic.vocab_size", s.vocab_size(),
                      " is too large");
  }
  RETURN_IF_ERROR(CheckPositive("data.synthetic.length", s.length()));
  if (s.length() > kMaxSpecSize) {
    return FieldError("data.synthetic.length", s.length(), " is too large");
  }
  const std::string task = v1::SyntheticTask_Name(s.task());
  const int64_t t = 2 * s.length();
  const int64_t vocab = s.vocab_size() + 1;
  if (m.input_dtype != v1::INT32 || m.input != Shape{t}) {
    return FieldError(
        "data.synthetic",
        absl::StrCat(task, " with length ", s.length(),
                     " needs a model input of INT32 [", t, "], got ",
                     Describe(m.input_dtype, m.input)));
  }
  if (m.output != Shape{t, vocab}) {
    return FieldError(
        "data.synthetic", task, " with vocab_size ", s.vocab_size(),
        " and length ", s.length(), " needs a model output of [", t, ", ",
        vocab, "] (the symbols and the separator), got ", m.output.ToString());
  }
  // Only an embedding takes int32 input, so it is the first layer.
  const int64_t embedded = model.layers(0).embedding().vocab_size();
  if (embedded < vocab) {
    return FieldError("model.layers[0].embedding.vocab_size", embedded,
                      " is smaller than the ", vocab,
                      " symbols of data.synthetic (vocab_size ", s.vocab_size(),
                      " plus the separator)");
  }
  return absl::OkStatus();
}

// a * b, or INT64_MAX when that overflows (both >= 0).
int64_t SaturatingProduct(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > std::numeric_limits<int64_t>::max() / b) {
    return std::numeric_limits<int64_t>::max();
  }
  return a * b;
}

absl::Status ValidateClassesTask(const v1::Synthetic& s, const ModelEnds& m) {
  RETURN_IF_ERROR(CheckPositive("data.synthetic.features", s.features()));
  if (s.classes() < 2) {
    return FieldError("data.synthetic.classes", "must be at least 2, got ",
                      s.classes());
  }
  if (m.input_dtype != v1::FLOAT32 || m.input.numel() != s.features()) {
    return FieldError("data.synthetic", "CLASSES with features ", s.features(),
                      " needs a FLOAT32 model input of ", s.features(),
                      " values, got ", Describe(m.input_dtype, m.input));
  }
  if (m.output != Shape{s.classes()}) {
    return FieldError("data.synthetic", "CLASSES with classes ", s.classes(),
                      " needs a model output of [", s.classes(), "], got ",
                      m.output.ToString());
  }
  return absl::OkStatus();
}

absl::Status ValidateSynthetic(const v1::Synthetic& s,
                               const v1::ModelSpec& model, const ModelEnds& m) {
  switch (s.task()) {
    case v1::COPY:
    case v1::REVERSE:
      RETURN_IF_ERROR(ValidateSequenceTask(s, model, m));
      break;
    case v1::CLASSES:
      RETURN_IF_ERROR(ValidateClassesTask(s, m));
      break;
    default:
      return FieldError("data.synthetic.task",
                        "must be COPY, REVERSE or CLASSES");
  }
  RETURN_IF_ERROR(
      CheckPositive("data.synthetic.train_samples", s.train_samples()));
  RETURN_IF_ERROR(
      CheckNonNegative("data.synthetic.test_samples", s.test_samples()));
  // Synthetic data is made whole in every worker that reads it: inputs and
  // targets of every sample.
  const int64_t targets = m.output.rank() == 2 ? m.output[0] : 1;
  const int64_t per_sample = std::max<int64_t>(m.input.numel(), 1) + targets;
  for (auto [field, n] :
       {std::pair{"data.synthetic.train_samples", s.train_samples()},
        std::pair{"data.synthetic.test_samples", SyntheticTestSamples(s)}}) {
    if (SaturatingProduct(n, per_sample) > kMaxDatasetValues) {
      return FieldError(field, n, " samples of ", per_sample,
                        " values each are too many (at most ",
                        kMaxDatasetValues, " values)");
    }
  }
  return absl::OkStatus();
}

// The vocabulary is only known once the file is read, so V is checked here
// only for being a vocabulary at all.
absl::Status ValidateText(const v1::TextFile& text, const ModelEnds& m) {
  if (text.path().empty()) return FieldError("data.text.path", "must be set");
  RETURN_IF_ERROR(CheckPositive("data.text.seq_len", text.seq_len()));
  RETURN_IF_ERROR(
      CheckTestFraction("data.text.test_fraction", text.test_fraction()));
  const int64_t t = text.seq_len();
  if (m.input_dtype != v1::INT32 || m.input != Shape{t}) {
    return FieldError("data.text", "seq_len ", t,
                      " needs a model input of INT32 [", t, "], got ",
                      Describe(m.input_dtype, m.input));
  }
  if (m.output.rank() != 2 || m.output[0] != t || m.output[1] < 2) {
    return FieldError("data.text", "seq_len ", t, " needs a model output of [",
                      t, ", V] with V >= 2, got ", m.output.ToString());
  }
  // A recorded vocabulary (a model file's, or one given): token i is its
  // byte i, so it must be a vocabulary and the model must score every one
  // of its tokens. A model file's, altered, made generate print bytes
  // from past its end.
  const std::string& vocabulary = text.vocabulary();
  for (size_t i = 1; i < vocabulary.size(); ++i) {
    const auto byte = [&](size_t j) {
      return static_cast<uint8_t>(vocabulary[j]);
    };
    if (byte(i) <= byte(i - 1)) {
      return FieldError("data.text.vocabulary",
                        "must hold distinct bytes in ascending order; byte ",
                        int{byte(i)}, " follows ", int{byte(i - 1)});
    }
  }
  if (static_cast<int64_t>(vocabulary.size()) > m.output[1]) {
    return FieldError("data.text.vocabulary", vocabulary.size(),
                      " tokens (the text's distinct bytes) are more than the ",
                      m.output[1], " the model scores (its output is ",
                      m.output.ToString(), ")");
  }
  return absl::OkStatus();
}

absl::Status ValidateTokens(const v1::TokenFile& tokens, const ModelEnds& m) {
  if (tokens.path().empty()) {
    return FieldError("data.tokens.path", "must be set");
  }
  if (!v1::TokenDtype_IsValid(tokens.dtype())) {
    return FieldError("data.tokens.dtype", "must be UINT16 or UINT32, got ",
                      static_cast<int>(tokens.dtype()));
  }
  RETURN_IF_ERROR(CheckPositive("data.tokens.seq_len", tokens.seq_len()));
  RETURN_IF_ERROR(
      CheckTestFraction("data.tokens.test_fraction", tokens.test_fraction()));
  if (tokens.header_bytes() < 0) {
    return FieldError("data.tokens.header_bytes", "must not be negative, got ",
                      tokens.header_bytes());
  }
  const int64_t t = tokens.seq_len();
  if (m.input_dtype != v1::INT32 || m.input != Shape{t}) {
    return FieldError("data.tokens", "seq_len ", t,
                      " needs a model input of INT32 [", t, "], got ",
                      Describe(m.input_dtype, m.input));
  }
  if (m.output.rank() != 2 || m.output[0] != t || m.output[1] < 2) {
    return FieldError("data.tokens", "seq_len ", t,
                      " needs a model output of [", t, ", V] with V >= 2, got ",
                      m.output.ToString());
  }
  return absl::OkStatus();
}

// The files' shapes are known once they are read (OpenJobDataset checks
// them against the model); here only what the spec says.
absl::Status ValidateTensorFiles(const v1::TensorFiles& t, const ModelEnds& m) {
  if (t.inputs().empty())
    return FieldError("data.tensors.inputs", "must be set");
  if (t.test_inputs().empty() != t.test_targets().empty() &&
      !(t.targets().empty() && !t.test_inputs().empty())) {
    return FieldError(t.test_inputs().empty() ? "data.tensors.test_inputs"
                                              : "data.tensors.test_targets",
                      "must be set with ",
                      t.test_inputs().empty() ? "test_targets" : "test_inputs");
  }
  RETURN_IF_ERROR(
      CheckTestFraction("data.tensors.test_fraction", t.test_fraction()));
  if (m.output.rank() < 1 || m.output[m.output.rank() - 1] < 2) {
    return FieldError("data.tensors",
                      "needs a model output of class scores ([C] or [T, C] "
                      "with C >= 2), got ",
                      m.output.ToString());
  }
  return absl::OkStatus();
}

absl::Status ValidateCsv(const v1::CsvFile& csv, const ModelEnds& m) {
  if (csv.path().empty()) return FieldError("data.csv.path", "must be set");
  if (csv.target().empty()) {
    return FieldError("data.csv.target",
                      "must name the target column (or give its index when "
                      "the file has no header)");
  }
  if (!csv.delimiter().empty() && csv.delimiter().size() != 1) {
    return FieldError("data.csv.delimiter", "must be one character, got \"",
                      csv.delimiter(), "\"");
  }
  RETURN_IF_ERROR(
      CheckTestFraction("data.csv.test_fraction", csv.test_fraction()));
  if (m.input_dtype != v1::FLOAT32 || m.input.rank() != 1) {
    return FieldError("data.csv",
                      "needs a model input of FLOAT32 [features], got ",
                      Describe(m.input_dtype, m.input));
  }
  if (m.output.rank() != 1 || m.output[0] < 2) {
    return FieldError("data.csv",
                      "needs a model output of [C] class scores with C >= 2, "
                      "got ",
                      m.output.ToString());
  }
  return absl::OkStatus();
}

absl::Status ValidateSource(const v1::DataSpec& data,
                            const v1::ModelSpec& model, const ModelEnds& m) {
  switch (data.source_case()) {
    case v1::DataSpec::kFashionMnist:
      return ValidateFashionMnist(m);
    case v1::DataSpec::kSynthetic:
      return ValidateSynthetic(data.synthetic(), model, m);
    case v1::DataSpec::kText:
      return ValidateText(data.text(), m);
    case v1::DataSpec::kTokens:
      return ValidateTokens(data.tokens(), m);
    case v1::DataSpec::kTensors:
      return ValidateTensorFiles(data.tensors(), m);
    case v1::DataSpec::kCsv:
      return ValidateCsv(data.csv(), m);
    case v1::DataSpec::SOURCE_NOT_SET:
      break;
  }
  return FieldError("data",
                    "no data source set (expected fashion_mnist, text, "
                    "tokens, tensors, csv or synthetic)");
}

absl::Status ValidateData(const v1::DataSpec& data, const v1::ModelSpec& model,
                          const ModelShapes& shapes) {
  const auto& dims = model.input().shape().dims();
  const ModelEnds m{model.input().dtype(),
                    Shape(std::vector<int64_t>(dims.begin(), dims.end())),
                    shapes.outputs.back()};
  RETURN_IF_ERROR(ValidateSource(data, model, m));
  if (data.has_normalize()) {
    const absl::Status fits =
        CheckNormalize(data.normalize(), m.input,
                       m.input_dtype == v1::INT32 ? DType::kI32 : DType::kF32);
    if (!fits.ok()) return FieldError("data.normalize", fits.message());
  }
  return absl::OkStatus();
}

absl::Status ValidateInitFrom(const v1::JobSpec& spec) {
  if (!spec.has_init_from()) return absl::OkStatus();
  if (spec.init_from().path().empty()) {
    return FieldError("init_from.path", "must be set");
  }
  RETURN_IF_ERROR(CheckNonNegative("init_from.step", spec.init_from().step()));
  if (InitialStep(spec) >= spec.steps()) {
    return FieldError("steps", spec.steps(), " must be more than the step ",
                      InitialStep(spec),
                      " that init_from continues from (init_from.step, "
                      "read from the file where left out; steps counts from "
                      "the start of that run)");
  }
  return absl::OkStatus();
}

// Replicas and gradient groups: the tree's leaves are whole groups, and
// each replica holds a run of whole groups (ReplicaGroups).
absl::Status ValidateReplicas(const v1::JobSpec& spec) {
  const v1::PipelineSpec& p = spec.pipeline();
  if (p.replicas() < 0 || p.replicas() > kMaxReplicas) {
    return FieldError("pipeline.replicas", "must be in [0, ", kMaxReplicas,
                      "] (0 means 1), got ", p.replicas());
  }
  const int64_t m = MicroBatchCount(spec);
  if (p.gradient_groups() < 0 || p.gradient_groups() > m) {
    return FieldError("pipeline.gradient_groups", "must be in [0, ", m,
                      "] (at most micro_batches; 0 means replicas), got ",
                      p.gradient_groups());
  }
  const int64_t r = ReplicaCount(spec);
  const int64_t g = GradientGroupCount(spec);
  if (p.min_replicas() < 0 || p.min_replicas() > r) {
    return FieldError("pipeline.min_replicas", "must be in [0, replicas ", r,
                      "] (0 means 1), got ", p.min_replicas());
  }
  if (m % g != 0) {
    return FieldError(
        p.gradient_groups() > 0 ? "pipeline.gradient_groups"
                                : "pipeline.replicas",
        g, p.gradient_groups() > 0 ? " gradient groups" : " replicas",
        " do not divide micro_batches ", m,
        ": each group is micro_batches / gradient_groups whole micro-batches");
  }
  if (r > g) {
    return FieldError("pipeline.replicas", r,
                      " replicas are more than gradient_groups ", g,
                      ": each replica runs one whole group at least");
  }
  const ScheduleKind schedule = ScheduleFromSpec(p.schedule());
  if (r > 1 && Interleaves(schedule)) {
    return FieldError("pipeline.replicas",
                      v1::Schedule_Name(ScheduleToSpec(schedule)),
                      " runs one replica so far; use GPIPE, ONE_F_ONE_B or "
                      "ZERO_BUBBLE_H1 with replicas");
  }
  // The norms add their parameter gradients in the input half of a split
  // backward, the others in the weight half, and ZB-H1 runs the next
  // micro-batch's input half before this one's weight half: a group's sum
  // would take the next group's norm gradients.
  if (g > r && SplitsBackward(schedule)) {
    return FieldError("pipeline.gradient_groups", g, " groups on ", r,
                      " replica", r > 1 ? "s" : "",
                      " put several groups on one replica, which ",
                      v1::Schedule_Name(ScheduleToSpec(schedule)),
                      " does not run yet: set gradient_groups to replicas");
  }
  return absl::OkStatus();
}

absl::Status ValidatePipeline(const v1::JobSpec& spec) {
  const v1::PipelineSpec& p = spec.pipeline();
  const int64_t layers = spec.model().layers_size();
  if (p.stages() < 0) {
    return FieldError("pipeline.stages", "must be >= 0 (0 means 1), got ",
                      p.stages());
  }
  const int64_t k = StageCount(spec);
  if (k > layers) {
    return FieldError("pipeline.stages", k, " is more than the ", layers,
                      " layers of the model");
  }
  if (p.micro_batches() < 0) {
    return FieldError("pipeline.micro_batches",
                      "must be >= 0 (0 means 1), got ", p.micro_batches());
  }
  if (MicroBatchCount(spec) > spec.batch_size()) {
    return FieldError("pipeline.micro_batches", MicroBatchCount(spec),
                      " is larger than batch_size ", spec.batch_size());
  }
  if (!v1::Schedule_IsValid(p.schedule())) {
    return FieldError("pipeline.schedule", "unknown value ",
                      static_cast<int>(p.schedule()));
  }
  if (!v1::Remat_IsValid(p.remat())) {
    return FieldError("pipeline.remat", "unknown value ",
                      static_cast<int>(p.remat()));
  }
  if (p.virtual_stages() < 0 || p.virtual_stages() > layers) {
    return FieldError(
        "pipeline.virtual_stages", "must be in [0, ", layers,
        "] (0 means 2 under the interleaved and zb-v schedules, 1 "
        "under the others), got ",
        p.virtual_stages());
  }
  const ScheduleKind schedule = ScheduleFromSpec(p.schedule());
  if (const std::string shape = ScheduleShapeError(
          schedule, k, MicroBatchCount(spec), VirtualStageCount(spec));
      !shape.empty()) {
    return FieldError(schedule == ScheduleKind::kInterleaved1F1B &&
                              VirtualStageCount(spec) >= 2
                          ? "pipeline.micro_batches"
                          : "pipeline.virtual_stages",
                      shape);
  }
  const int64_t chunks = ChunkCount(spec);
  if (chunks > layers) {
    return FieldError("pipeline.virtual_stages", k, " stages x ",
                      VirtualStageCount(spec), " chunks is more than the ",
                      layers, " layers of the model");
  }
  // Every worker's schedule is a list of each chunk's passes of each
  // micro-batch, which the controller builds to check a job's memory: 2
  // stages of 16,777,216 micro-batches took it 2.4 GB and 4 s a submit.
  if (SaturatingProduct(chunks, MicroBatchCount(spec)) > kMaxStagePasses) {
    return FieldError(
        "pipeline.micro_batches", MicroBatchCount(spec), " micro-batches over ",
        chunks, chunks == 1 ? " stage" : " stages",
        chunks != k ? " (chunks)" : "", " are too many passes a step (at most ",
        kMaxStagePasses, " micro-batches times stages)");
  }
  if (!p.balance().empty()) {
    if (p.balance_size() != chunks) {
      return FieldError("pipeline.balance", "length ", p.balance_size(),
                        " does not match pipeline.stages ", k,
                        chunks != k ? absl::StrCat(" x virtual_stages ",
                                                   VirtualStageCount(spec))
                                    : "");
    }
    for (int i = 0; i < p.balance_size(); ++i) {
      RETURN_IF_ERROR(CheckPositive(absl::StrCat("pipeline.balance[", i, "]"),
                                    p.balance(i)));
    }
    if (const std::string sum = BalanceSumError(p.balance(), layers);
        !sum.empty()) {
      return FieldError("pipeline.balance", sum);
    }
  }
  if (p.min_stages() < 0) {
    return FieldError("pipeline.min_stages",
                      "must be >= 0 (0 means stages), got ", p.min_stages());
  }
  if (p.min_stages() > k) {
    return FieldError("pipeline.min_stages", p.min_stages(),
                      " is more than the ", k, " stages");
  }
  RETURN_IF_ERROR(ValidateReplicas(spec));
  const v1::RebalanceSpec& r = p.rebalance();
  if (r.after_steps() < 0 || r.after_steps() > kMaxSteps) {
    return FieldError("pipeline.rebalance.after_steps", "must be in [0, ",
                      kMaxSteps, "] (0 means 20), got ", r.after_steps());
  }
  if (r.every_steps() < 0 || r.every_steps() > kMaxSteps) {
    return FieldError("pipeline.rebalance.every_steps", "must be in [0, ",
                      kMaxSteps, "] (0 means 100), got ", r.every_steps());
  }
  if (!(r.min_gain() >= 0 && r.min_gain() < 1)) {
    return FieldError("pipeline.rebalance.min_gain",
                      "must be in [0, 1) (0 means 0.10), got ", r.min_gain());
  }
  if (r.has_enabled() && r.enabled() && spec.checkpoint().every() == 0) {
    return FieldError("pipeline.rebalance.enabled",
                      "needs periodic checkpoints (checkpoint.every > 0): "
                      "the layers move at a committed checkpoint");
  }
  return absl::OkStatus();
}

int64_t SaturatingNumel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape.dims())
    n = SaturatingProduct(n, std::max<int64_t>(d, 0));
  return n;
}

// The memory a spec asks for, against the k* limits (job_spec.h).
absl::Status ValidateSizes(const v1::JobSpec& spec, const ModelShapes& shapes) {
  if (spec.batch_size() > kMaxBatchSize) {
    return FieldError("batch_size", spec.batch_size(),
                      " is too large (at most ", kMaxBatchSize, ")");
  }
  if (spec.eval().batch_size() > kMaxBatchSize) {
    return FieldError("eval.batch_size", spec.eval().batch_size(),
                      " is too large (at most ", kMaxBatchSize, ")");
  }
  const int64_t batch = std::max(spec.batch_size(), spec.eval().batch_size());
  int64_t parameters = 0;
  for (size_t i = 0; i < shapes.outputs.size(); ++i) {
    const std::string layer = absl::StrCat(
        "model.layers[", i, "].",
        AsAbsl(LayerKindName(spec.model().layers(static_cast<int>(i)))));
    const int64_t sample = SaturatingNumel(shapes.outputs[i]);
    if (sample > kMaxSampleValues) {
      return FieldError(layer, "its output ", shapes.outputs[i].ToString(),
                        " has ", sample, " values per sample, more than ",
                        kMaxSampleValues);
    }
    if (SaturatingProduct(sample, batch) > kMaxBatchValues) {
      return FieldError(layer, "its output ", shapes.outputs[i].ToString(),
                        " times the batch of ", batch, " is more than ",
                        kMaxBatchValues, " values");
    }
    const int64_t own = shapes.costs[i].param_bytes / 4;
    if (own > kMaxLayerParameters) {
      return FieldError(layer, "has ", own, " parameters, more than ",
                        kMaxLayerParameters,
                        " (a layer is held whole by one worker)");
    }
    parameters =
        std::min(parameters + own, std::numeric_limits<int64_t>::max() / 2);
    if (parameters > kMaxModelParameters) {
      return FieldError(layer, "brings the model to more than ",
                        kMaxModelParameters, " parameters");
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t StageCount(const v1::JobSpec& spec) {
  return spec.pipeline().stages() == 0 ? 1 : spec.pipeline().stages();
}

std::string BalanceSumError(
    const google::protobuf::RepeatedField<int64_t>& balance, int64_t layers) {
  int64_t sum = 0;
  for (const int64_t b : balance) {
    if (__builtin_add_overflow(sum, b, &sum)) {
      return absl::StrCat("sums to more than ",
                          std::numeric_limits<int64_t>::max(),
                          " but the model has ", layers, " layers");
    }
  }
  // The sum itself (it said "more than" the layers): a user sees by how
  // much.
  if (sum == layers) return "";
  return absl::StrCat("sums to ", sum, " but the model has ", layers,
                      " layers");
}

int64_t VirtualStageCount(const v1::JobSpec& spec) {
  return ChunksPerWorker(ScheduleFromSpec(spec.pipeline().schedule()),
                         spec.pipeline().virtual_stages());
}

int64_t ChunkCount(const v1::JobSpec& spec) {
  return StageCount(spec) * VirtualStageCount(spec);
}

int64_t MicroBatchCount(const v1::JobSpec& spec) {
  return spec.pipeline().micro_batches() == 0 ? 1
                                              : spec.pipeline().micro_batches();
}

int64_t ReplicaCount(const v1::JobSpec& spec) {
  return std::max<int64_t>(1, spec.pipeline().replicas());
}

int64_t GradientGroupCount(const v1::JobSpec& spec) {
  return spec.pipeline().gradient_groups() > 0
             ? spec.pipeline().gradient_groups()
             : ReplicaCount(spec);
}

namespace {

// What makes a name print as something else, named ("the direction control
// U+202E"), or "" for none: bidirectional controls (U+202E turned `gpipectl
// list`'s row around), C1 controls, bytes that are not UTF-8.
std::string InvisibleCharacterIn(const std::string& name) {
  for (size_t i = 0; i < name.size();) {
    const unsigned char c = name[i];
    int length = c < 0x80         ? 1
                 : (c >> 5) == 6  ? 2
                 : (c >> 4) == 14 ? 3
                 : (c >> 3) == 30 ? 4
                                  : 0;
    if (length == 0 || i + length > name.size())
      return "bytes that are not UTF-8";
    uint32_t code = length == 1 ? c : c & (0x7f >> length);
    for (int k = 1; k < length; ++k) {
      const unsigned char next = name[i + k];
      if ((next >> 6) != 2) return "bytes that are not UTF-8";
      code = (code << 6) | (next & 0x3f);
    }
    i += length;
    const bool direction = code == 0x061c || code == 0x200e || code == 0x200f ||
                           (code >= 0x202a && code <= 0x202e) ||
                           (code >= 0x2066 && code <= 0x2069);
    if (direction || (code >= 0x80 && code <= 0x9f)) {
      return absl::StrFormat(
          "the %s U+%04X",
          direction ? "direction control" : "control character", code);
    }
  }
  return "";
}

// Before anything walks the spec: its size, its layer count, its name.
absl::Status ValidateLimits(const v1::JobSpec& spec) {
  const int64_t bytes = static_cast<int64_t>(spec.ByteSizeLong());
  if (bytes > kMaxSpecBytes) {
    return FieldError("job spec", bytes, " bytes is too large (at most ",
                      kMaxSpecBytes, ")");
  }
  if (spec.model().layers_size() > kMaxLayers) {
    return FieldError("model.layers", spec.model().layers_size(),
                      " layers are too many (at most ", kMaxLayers, ")");
  }
  const std::string& name = spec.name();
  if (static_cast<int64_t>(name.size()) > kMaxNameBytes) {
    return FieldError("name", name.size(), " bytes is too long (at most ",
                      kMaxNameBytes, ")");
  }
  // Names are for people and logs: no control characters (newlines, ANSI
  // escapes) and nothing that reads as a path.
  for (unsigned char c : name) {
    if (c < 0x20 || c == 0x7f) {
      return FieldError("name", "holds a control character (byte ",
                        static_cast<int>(c), ")");
    }
    if (c == '/' || c == '\\') {
      return FieldError("name", "holds a path separator ('",
                        std::string(1, static_cast<char>(c)), "')");
    }
  }
  if (const std::string bad = InvisibleCharacterIn(name); !bad.empty()) {
    return FieldError("name", "holds ", bad);
  }
  if (spec.steps() > kMaxSteps) {
    return FieldError("steps", spec.steps(), " is too many (at most ",
                      kMaxSteps, ")");
  }
  if (spec.checkpoint().keep() > kMaxKeptCheckpoints) {
    return FieldError("checkpoint.keep", spec.checkpoint().keep(),
                      " is too many (at most ", kMaxKeptCheckpoints, ")");
  }
  if (spec.max_restarts() > kMaxRestarts) {
    return FieldError("max_restarts", spec.max_restarts(),
                      " is too many (at most ", kMaxRestarts, ")");
  }
  const int64_t stall = spec.pipeline().stall_timeout_ms();
  if (stall < 0 || stall > kMaxElasticGraceMs) {
    return FieldError("pipeline.stall_timeout_ms", "must be in [0, ",
                      kMaxElasticGraceMs, "] (0: the default), got ", stall);
  }
  const int64_t grace = spec.pipeline().elastic_grace_ms();
  if (grace < 0 || grace > kMaxElasticGraceMs) {
    return FieldError("pipeline.elastic_grace_ms", "must be in [0, ",
                      kMaxElasticGraceMs, "] (0 means 10 s), got ", grace);
  }
  return absl::OkStatus();
}

}  // namespace

RebalanceSettings RebalanceSettingsOf(const v1::JobSpec& spec) {
  const v1::RebalanceSpec& r = spec.pipeline().rebalance();
  RebalanceSettings s;
  s.enabled = r.has_enabled() ? r.enabled()
                              : spec.pipeline().balance().empty() &&
                                    spec.checkpoint().every() > 0;
  if (r.after_steps() > 0) s.after_steps = r.after_steps();
  if (r.every_steps() > 0) s.every_steps = r.every_steps();
  if (r.min_gain() > 0) s.min_gain = r.min_gain();
  return s;
}

namespace {

// Batch norm takes each micro-batch's own statistics (per feature, over
// its samples and positions): from one value the normalized output is 0
// whatever came in, so no gradient passes and the layers before it never
// train (a batch of 2 in 2 micro-batches trained to chance, silently).
// PyTorch refuses the same case.
absl::Status ValidateBatchNormSamples(const v1::JobSpec& spec,
                                      const ModelShapes& shapes) {
  const int64_t m = MicroBatchCount(spec);
  const int64_t smallest = spec.batch_size() / m;  // SplitMicroBatches'
  for (int64_t i = 0; i < spec.model().layers_size(); ++i) {
    const v1::LayerSpec& layer = spec.model().layers(i);
    if (!layer.has_batch_norm() ||
        i >= static_cast<int64_t>(shapes.inputs.size()))
      continue;
    const Shape& in = shapes.inputs[i];
    const int64_t features =
        std::max<int64_t>(1, layer.batch_norm().features());
    const int64_t positions = in.numel() / features;
    if (smallest * positions >= 2) continue;
    return FieldError(
        absl::StrCat("model.layers[", i, "].batch_norm"),
        "normalizes each micro-batch over its samples: batch_size ",
        spec.batch_size(), " in ", m, " micro-batches leaves micro-batches of ",
        smallest,
        " sample, whose normalized output is 0 and passes no gradient (make "
        "every micro-batch at least 2 samples: a larger batch_size or fewer "
        "micro-batches)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  RETURN_IF_ERROR(ValidateLimits(spec));
  for (const DataDependentField& f : DataDependentFields(spec)) {
    if (!f.required) continue;
    // A missing file leads: "give the value" alone sent a user whose
    // path was wrong on to "cannot open" it.
    const absl::Status readable = CheckSpecPathsExist(spec);
    if (!readable.ok()) {
      // A missing init file stops the filling too: the trained model's
      // columns, normalization and vocabulary come from it first.
      if (absl::StartsWith(readable.message(), "init_from.path:")) {
        return absl::InvalidArgumentError(absl::StrCat(
            readable.message(),
            " here: a job started from a model takes its inputs' "
            "preprocessing from that file where it is submitted, before ",
            f.field,
            " is filled from the data: fix the path, or, where only the "
            "cluster's machines have the file, give ",
            f.give, " in the spec"));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          readable.message(), " here, and ", f.field,
          " is filled from the data where the job is submitted: fix the "
          "path, or, where only the cluster's machines have the file, give ",
          f.give, " in the spec"));
    }
    return FieldError(
        f.field,
        "is filled from the data where the job is submitted, but the data "
        "could not be read there; give ",
        f.give, " in the spec");
  }
  ASSIGN_OR_RETURN(const ModelShapes shapes, InferModelShapes(spec.model()));
  RETURN_IF_ERROR(CheckPositive("batch_size", spec.batch_size()));
  RETURN_IF_ERROR(CheckPositive("steps", spec.steps()));
  RETURN_IF_ERROR(ValidateSizes(spec, shapes));
  RETURN_IF_ERROR(ValidateOptimizer(spec.optimizer()));
  RETURN_IF_ERROR(ValidateData(spec.data(), spec.model(), shapes));
  RETURN_IF_ERROR(ValidateInitFrom(spec));
  RETURN_IF_ERROR(ValidatePipeline(spec));
  RETURN_IF_ERROR(ValidateBatchNormSamples(spec, shapes));
  RETURN_IF_ERROR(
      CheckNonNegative("checkpoint.every", spec.checkpoint().every()));
  RETURN_IF_ERROR(
      CheckNonNegative("checkpoint.keep", spec.checkpoint().keep()));
  RETURN_IF_ERROR(CheckNonNegative("eval.every", spec.eval().every()));
  RETURN_IF_ERROR(
      CheckNonNegative("eval.batch_size", spec.eval().batch_size()));
  RETURN_IF_ERROR(
      CheckNonNegative("eval.max_samples", spec.eval().max_samples()));
  RETURN_IF_ERROR(CheckNonNegative("max_restarts", spec.max_restarts()));
  return absl::OkStatus();
}

namespace {

// protobuf's words for a name an enum field does not have end "invalid
// value \"ZB_H2\" for type type.googleapis.com/gpipe.v1.Schedule": the
// names it has are added, as a user cannot guess them from the type.
std::string WithEnumNames(absl::string_view message) {
  constexpr absl::string_view kType = "for type type.googleapis.com/";
  const size_t at = message.rfind(kType);
  if (at == absl::string_view::npos ||
      !absl::StrContains(message, "invalid value")) {
    return std::string(message);
  }
  const std::string type(message.substr(at + kType.size()));
  const google::protobuf::EnumDescriptor* e =
      google::protobuf::DescriptorPool::generated_pool()->FindEnumTypeByName(
          type);
  if (e == nullptr) return std::string(message);
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) {
    const std::string& name = e->value(i)->name();
    if (!absl::EndsWith(name, "UNSPECIFIED")) names.push_back(name);
  }
  return absl::StrCat(message.substr(0, at), "(one of ",
                      absl::StrJoin(names, ", "), ")");
}

}  // namespace

namespace {

// Letters alone, in lower case: "batch_size", "batchSize" and "batchsize"
// are one name.
std::string FoldedName(absl::string_view name) {
  std::string out;
  for (char c : name) {
    if (absl::ascii_isalnum(c)) out.push_back(absl::ascii_tolower(c));
  }
  return out;
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1,
                         diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The message `path` ("model.layers[0].linear", protobuf's path to an
// unknown field's parent; "" for the spec itself) points into, or null.
const google::protobuf::Descriptor* MessageAt(absl::string_view path) {
  const google::protobuf::Descriptor* d = v1::JobSpec::descriptor();
  for (absl::string_view part : absl::StrSplit(path, '.', absl::SkipEmpty())) {
    part = part.substr(0, part.find('['));
    const google::protobuf::FieldDescriptor* f = nullptr;
    for (int i = 0; i < d->field_count() && f == nullptr; ++i) {
      if (d->field(i)->name() == part || d->field(i)->json_name() == part)
        f = d->field(i);
    }
    if (f == nullptr || f->message_type() == nullptr) return nullptr;
    d = f->message_type();
  }
  return d;
}

// " (did you mean batchSize?)" for an unknown field of the spec's JSON
// whose name is one of its message's fields spelt otherwise (case,
// underscores) or a letter or two away; "" otherwise. protobuf's error
// names the field and nothing more.
std::string FieldSuggestion(absl::string_view error) {
  constexpr absl::string_view kUnknown = ": Cannot find field.";
  if (!absl::EndsWith(error, kUnknown)) return "";
  absl::string_view field = error.substr(0, error.size() - kUnknown.size());
  absl::string_view parent;
  if (absl::StartsWith(field, "(")) {
    const size_t close = field.find(") ");
    if (close == absl::string_view::npos) return "";
    parent = field.substr(1, close - 1);
    field = field.substr(close + 2);
  }
  const google::protobuf::Descriptor* d = MessageAt(parent);
  if (d == nullptr) return "";
  const std::string folded = FoldedName(field);
  std::string best;
  size_t best_distance = folded.size() < 6 ? 1 : 2;
  for (int i = 0; i < d->field_count(); ++i) {
    const std::string& json_name = d->field(i)->json_name();
    const size_t distance = EditDistance(folded, FoldedName(json_name));
    if (distance <= best_distance) {
      best_distance = distance;
      best = json_name;
    }
  }
  return best.empty() ? "" : absl::StrCat(" (did you mean ", best, "?)");
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecJson(std::string_view json,
                                             SpecCheck check) {
  // A byte-order mark, as Windows editors save UTF-8, is no part of the
  // JSON: "Expected a value." with a caret under invisible bytes.
  if (json.size() >= 3 && json.substr(0, 3) == "\xEF\xBB\xBF")
    json.remove_prefix(3);
  RETURN_IF_ERROR(CheckSpecJsonStructure(json));
  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      std::string(json), &spec, options);
  if (!parsed.ok()) {
    const auto message = parsed.message();  // StringPiece or string_view
    absl::string_view text(message.data(), message.size());
    // protobuf's path comes first, empty for the root (": Root element must
    // be a message."), and a caret under the input's text follows, where
    // there was no text to show only the caret.
    absl::ConsumePrefix(&text, ": ");
    if (const size_t end = text.find('\n');
        end != absl::string_view::npos &&
        absl::StripAsciiWhitespace(text.substr(end)) == "^") {
      text = text.substr(0, end);
    }
    // A NUL quoted back from the input would end the message where it is
    // printed as a C string ("job spec: mod").
    const std::string suggestion = FieldSuggestion(text);
    if (!suggestion.empty()) absl::ConsumeSuffix(&text, ".");
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: ",
                     WithEnumNames(absl::StrReplaceAll(
                         text, {{absl::string_view("\0", 1), "\\0"}})),
                     suggestion, suggestion.empty() ? "" : "."));
  }
  if (check == SpecCheck::kWhole) RETURN_IF_ERROR(CheckJobSpec(&spec));
  return spec;
}

absl::Status CheckJobSpec(v1::JobSpec* spec) {
  // Where the data can be read (the submitter's machine), what only the
  // data says is written into the spec before it is checked.
  const std::vector<DataDependentField> pending = DataDependentFields(*spec);
  if (!pending.empty() && CheckSpecPathsExist(*spec).ok()) {
    // A spec that can be checked without its data is, first: a mistake in
    // it is named as such, not by what reading the data then tripped on.
    if (std::none_of(pending.begin(), pending.end(),
                     [](const DataDependentField& f) { return f.required; })) {
      RETURN_IF_ERROR(ValidateJobSpec(*spec));
    }
    return ResolveAndValidateJobSpec(spec);
  }
  return ValidateJobSpec(*spec);
}

absl::Status ResolveAndValidateJobSpec(v1::JobSpec* spec) {
  std::vector<FilledSize> filled;
  RETURN_IF_ERROR(ResolveDataDependentFields(spec, &filled));
  absl::Status valid = ValidateJobSpec(*spec);
  if (valid.ok()) return valid;
  // A note explains an error about its layer only. Every error carried
  // every note, a negative lr or a bad --balance included.
  std::vector<std::string> relevant;
  for (const FilledSize& f : filled) {
    if (absl::StrContains(valid.message(), f.layer)) relevant.push_back(f.note);
  }
  if (relevant.empty()) return valid;
  return absl::Status(
      valid.code(),
      absl::StrCat(valid.message(), " (", absl::StrJoin(relevant, "; "), ")"));
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path,
                                            SpecCheck check) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    // errno 0 would map to OK; an unopenable file is never that.
    return absl::Status(
        err == 0 ? absl::StatusCode::kUnknown : absl::ErrnoToStatusCode(err),
        absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  // Read no more than a spec can be: the size limit was checked after
  // parsing, so /dev/zero or a stray multi-gigabyte file filled the memory
  // first. JSON spends more bytes than the binary limit counts (names,
  // spaces), so the file may be several times that.
  constexpr int64_t kMaxFileBytes = 16 * kMaxSpecBytes;
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(text.size()) > kMaxFileBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": more than ", kMaxFileBytes,
                       " bytes is too large for a job spec"));
    }
  }
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(path, ": read failed"));
  }
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(text, check);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(),
                        absl::StrCat(path, ": ", spec.status().message()));
  }
  return spec;
}

namespace {

// What the data is, for messages: "data.text.path /x/corpus.txt".
std::string DataSourceName(const v1::DataSpec& data) {
  switch (data.source_case()) {
    case v1::DataSpec::kText:
      return absl::StrCat("data.text.path ", data.text().path());
    // Both files of a split pair: the largest id may be in either, and
    // naming the train file for one in the test file sent users to the
    // wrong one.
    case v1::DataSpec::kTokens:
      return data.tokens().test_path().empty()
                 ? absl::StrCat("data.tokens.path ", data.tokens().path())
                 : absl::StrCat("data.tokens.path ", data.tokens().path(),
                                " and data.tokens.test_path ",
                                data.tokens().test_path());
    case v1::DataSpec::kTensors:
      return data.tensors().test_inputs().empty()
                 ? absl::StrCat("data.tensors.inputs ", data.tensors().inputs())
                 : absl::StrCat("data.tensors.inputs ", data.tensors().inputs(),
                                " and data.tensors.test_inputs ",
                                data.tensors().test_inputs());
    case v1::DataSpec::kCsv:
      return absl::StrCat("data.csv.path ", data.csv().path());
    case v1::DataSpec::kFashionMnist:
      return "data.fashion_mnist";
    case v1::DataSpec::kSynthetic:
      return "data.synthetic";
    case v1::DataSpec::SOURCE_NOT_SET:
      break;
  }
  return "data";
}

// Where the targets come from: a tensors source names its targets file,
// where a label out of range is (the inputs file was named).
std::string DataTargetsName(const v1::DataSpec& data) {
  if (data.has_tensors() && !data.tensors().targets().empty()) {
    return absl::StrCat("data.tensors.targets ", data.tensors().targets());
  }
  if (data.has_csv()) {
    return absl::StrCat("data.csv.path ", data.csv().path(), " (column ",
                        data.csv().target(), ")");
  }
  return DataSourceName(data);
}

// Whether a target of `split` is a class at or past `head` (targets of -1
// are ignored ones). Read only on the way to an error, in chunks.
bool SplitHasClassAtLeast(const Dataset& data, Split split, int64_t head) {
  constexpr int64_t kChunk = 1 << 14;
  std::vector<int64_t> indices;
  for (int64_t start = 0; start < data.size(split); start += kChunk) {
    indices.clear();
    for (int64_t i = start; i < std::min(data.size(split), start + kChunk); ++i)
      indices.push_back(i);
    const Tensor targets = data.GatherTargets(split, indices);
    if (targets.dtype() != DType::kI32) return false;
    const int32_t* t = targets.i32();
    for (int64_t i = 0; i < targets.numel(); ++i)
      if (t[i] >= head) return true;
  }
  return false;
}

// DataTargetsName, or the test split's file where the class past `head`
// is only there: a label past the head in a CSV's test_path or a tensors
// source's test_targets was blamed on the training file.
std::string TargetsPastHeadName(const v1::DataSpec& spec, const Dataset& data,
                                int64_t head) {
  const bool test_file =
      (spec.has_csv() && !spec.csv().test_path().empty()) ||
      (spec.has_tensors() && !spec.tensors().test_targets().empty());
  if (!test_file || SplitHasClassAtLeast(data, Split::kTrain, head))
    return DataTargetsName(spec);
  if (spec.has_csv()) {
    return absl::StrCat("data.csv.test_path ", spec.csv().test_path(),
                        " (column ", spec.csv().target(), ")");
  }
  return absl::StrCat("data.tensors.test_targets ",
                      spec.tensors().test_targets());
}

}  // namespace

absl::Status CheckDataFitsModel(const v1::JobSpec& spec, const Dataset& data) {
  ASSIGN_OR_RETURN(const ModelShapes shapes, InferModelShapes(spec.model()));
  const int64_t classes = data.num_classes();
  const int64_t ids = data.num_input_ids();
  const v1::ModelSpec& model = spec.model();
  // Token ids index the embedding's table: one beyond it would read and
  // write outside it.
  if (data.input_dtype() == DType::kI32 && model.layers_size() > 0 &&
      model.layers(0).has_embedding() &&
      ids > model.layers(0).embedding().vocab_size()) {
    return FieldError("model.layers[0].embedding.vocab_size",
                      model.layers(0).embedding().vocab_size(),
                      " is smaller than the ", ids, " tokens of ",
                      DataSourceName(spec.data()), " (set it to at least ", ids,
                      ")");
  }
  // Targets index the loss's classes (the last dimension of the output),
  // one class id for each row of scores: [T, C] scores take [T] ids, [C]
  // one (or [1]: a column vector of ids is the same ids). Targets of [2]
  // for [10] scores were taken, and read as two samples' worth.
  const Shape& out = shapes.outputs.back();
  const int64_t head = out.rank() > 0 ? out[out.rank() - 1] : 0;
  std::vector<int64_t> per_row;
  for (int64_t d = 0; d + 1 < out.rank(); ++d) per_row.push_back(out[d]);
  const Shape expected(per_row);
  if (data.target_shape().numel() != expected.numel()) {
    return FieldError(DataTargetsName(spec.data()), "targets per sample are ",
                      data.target_shape().ToString(),
                      ", but the model's output ", out.ToString(), " takes ",
                      expected.ToString(),
                      " (one class id for each row of scores)");
  }
  if (classes > head) {
    return FieldError(
        absl::StrCat("model.layers[", model.layers_size() - 1, "]"), head,
        " outputs are fewer than the ", classes, " classes of ",
        TargetsPastHeadName(spec.data(), data, head),
        " (its targets would index past them)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenJobDataset(
    const gpipe::v1::JobSpec& spec) {
  const auto& dims = spec.model().input().shape().dims();
  // Tensor files are converted to the model's input dtype: token ids for
  // an INT32 model (read as float32 they were the floats' bit patterns).
  ASSIGN_OR_RETURN(
      std::unique_ptr<Dataset> data,
      OpenDataset(
          spec.data(), Shape(std::vector<int64_t>(dims.begin(), dims.end())),
          spec.seed(),
          spec.model().input().dtype() == gpipe::v1::INT32 ? DType::kI32
                                                           : DType::kF32));
  RETURN_IF_ERROR(CheckDataFitsModel(spec, *data));
  return data;
}

}  // namespace gpipe
