// init_from: a run continued from a checkpoint file with its optimizer state
// ends bitwise equal to one run of all the steps, on the reference trainer
// and on an in-process pipeline; without the optimizer state the weights
// load and training starts over at step 0; strict and non-strict matching;
// every mismatch named.
#include "services/pipeline/init_weights.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/pipeline/data_resolution.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/model_file.h"
#include "services/pipeline/reference_trainer.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors.h"
#include "services/storage/sha256.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

constexpr char kSpec[] = R"({
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"in_features": 8, "out_features": 16}},
      {"relu": {}},
      {"linear": {"in_features": 16, "out_features": 16}},
      {"tanh": {}},
      {"linear": {"in_features": 16, "out_features": 3}}
    ],
    "loss": {"softmax_cross_entropy": {}}
  },
  "optimizer": {"lr": 0.01, "adamw": {}, "warmup_steps": 2,
                "decay": "LR_DECAY_COSINE", "clip_norm": 1.0},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "train_samples": 256, "test_samples": 32}},
  "pipeline": {"stages": 2, "micro_batches": 4},
  "batch_size": 32,
  "steps": 8,
  "seed": 5
})";

using State = std::map<std::string, std::vector<float>>;

State Snapshot(std::vector<NamedTensor> tensors) {
  State s;
  for (const NamedTensor& t : tensors) {
    const Tensor host = t.tensor->To(Device::kCpu);
    s[t.name].assign(host.f32(), host.f32() + host.numel());
  }
  return s;
}

class InitWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("init_weights_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    auto spec = ParseJobSpecJson(kSpec);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Trains `steps` steps on the reference trainer; writes its model state
  // (and optimizer state when `with_optimizer`) to `name` as a checkpoint
  // file does, and returns the path.
  std::string TrainAndSave(int64_t steps, const std::string& name,
                           bool with_optimizer,
                           std::map<std::string, std::string> metadata = {}) {
    auto t = ReferenceTrainer::Create(spec_);
    EXPECT_TRUE(t.ok()) << t.status();
    for (int64_t s = 0; s < steps; ++s) EXPECT_TRUE((*t)->Step().ok());
    std::vector<NamedTensor> all = (*t)->model().StateTensors();
    if (with_optimizer) {
      for (const NamedTensor& n : (*t)->optimizer().State()) all.push_back(n);
    }
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    for (const NamedTensor& n : all) tensors.emplace_back(n.name, n.tensor);
    if (metadata.empty()) metadata = {{"step", absl::StrCat(steps)}};
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(WriteSafetensors(path, tensors, metadata).ok());
    return path;
  }

  State Uninterrupted() {
    auto t = ReferenceTrainer::Create(spec_);
    EXPECT_TRUE(t.ok()) << t.status();
    while ((*t)->step() < spec_.steps()) EXPECT_TRUE((*t)->Step().ok());
    return Snapshot((*t)->StateTensors());
  }

  gpipe::v1::JobSpec Continuing(const std::string& path, bool optimizer) {
    gpipe::v1::JobSpec spec = spec_;
    spec.mutable_init_from()->set_path(path);
    spec.mutable_init_from()->set_optimizer_state(optimizer);
    EXPECT_TRUE(ResolveDataDependentFields(&spec).ok());
    return spec;
  }

  std::filesystem::path dir_;
  gpipe::v1::JobSpec spec_;
};

TEST_F(InitWeightsTest, ContinuingWithOptimizerStateIsBitwiseOneRun) {
  const State whole = Uninterrupted();
  const std::string half = TrainAndSave(3, "step3.safetensors", true);
  const gpipe::v1::JobSpec spec = Continuing(half, true);
  EXPECT_EQ(spec.init_from().step(), 3);  // filled from the file at submit
  EXPECT_EQ(InitialStep(spec), 3);

  auto reference = ReferenceTrainer::Create(spec);
  ASSERT_TRUE(reference.ok()) << reference.status();
  EXPECT_EQ((*reference)->step(), 3);
  EXPECT_THAT((*reference)->init_summary(), HasSubstr("loaded "));
  while ((*reference)->step() < spec.steps()) {
    ASSERT_TRUE((*reference)->Step().ok());
  }
  EXPECT_EQ(Snapshot((*reference)->StateTensors()), whole);

  // Two stages, each loading its own layers from the same file.
  auto pipeline = InProcessPipeline::Create(spec, OptionsFromSpec(spec));
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ((*pipeline)->step(), 3);
  while ((*pipeline)->step() < spec.steps()) {
    ASSERT_TRUE((*pipeline)->Step().ok());
  }
  EXPECT_EQ(Snapshot((*pipeline)->StateTensors()), whole);

  // A step written by hand that is not the file's skipped steps 4-7 (and
  // their learning rates) without a word.
  gpipe::v1::JobSpec skipping = spec;
  skipping.mutable_init_from()->set_step(7);
  auto refused = ReferenceTrainer::Create(skipping);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("init_from.step: 7 is not the step 3 that "));
  EXPECT_FALSE(
      InProcessPipeline::Create(skipping, OptionsFromSpec(skipping)).ok());
}

TEST_F(InitWeightsTest,
       WithoutOptimizerStateTheWeightsLoadAndTrainingStartsOver) {
  const std::string half =
      TrainAndSave(3, "model.safetensors", false, {{"gpipe.step", "3"}});
  auto three = ReferenceTrainer::Create(spec_);
  ASSERT_TRUE(three.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*three)->Step().ok());
  const State after_three = Snapshot((*three)->StateTensors());

  const gpipe::v1::JobSpec spec = Continuing(half, false);
  EXPECT_EQ(InitialStep(spec), 0);
  auto t = ReferenceTrainer::Create(spec);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->step(), 0);
  EXPECT_EQ(Snapshot((*t)->StateTensors()), after_three);
  // The documented difference: fresh moments and the schedule's first
  // steps again, so the run does not end where one 8-step run ends.
  while ((*t)->step() < spec.steps()) ASSERT_TRUE((*t)->Step().ok());
  EXPECT_NE(Snapshot((*t)->StateTensors()), Uninterrupted());

  // Asking for optimizer state a model file does not hold fails at once.
  gpipe::v1::JobSpec wants = spec_;
  wants.mutable_init_from()->set_path(half);
  wants.mutable_init_from()->set_optimizer_state(true);
  wants.mutable_init_from()->set_step(3);
  auto refused = ReferenceTrainer::Create(wants);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("init_from.optimizer_state: "));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("holds no optimizer state"));
}

TEST_F(InitWeightsTest, StrictNamesWhatIsMissingAndExtraNonStrictLoadsTheRest) {
  auto source = ReferenceTrainer::Create(spec_);
  ASSERT_TRUE(source.ok());
  ASSERT_TRUE((*source)->Step().ok());
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const NamedTensor& n : (*source)->model().StateTensors()) {
    if (n.name != "layers.4.bias") tensors.emplace_back(n.name, n.tensor);
  }
  const Tensor extra = Tensor::Zeros(Shape{2}, DType::kF32);
  tensors.emplace_back("layers.9.weight", &extra);
  tensors.emplace_back("head.scale", &extra);
  const std::string path = (dir_ / "partial.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path, tensors, {}).ok());

  gpipe::v1::JobSpec spec = spec_;
  spec.mutable_init_from()->set_path(path);
  auto strict = ReferenceTrainer::Create(spec);
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(strict.status().message(), HasSubstr("missing 1: layers.4.bias"));
  EXPECT_THAT(strict.status().message(),
              HasSubstr("not in the model 2: head.scale, layers.9.weight"));
  EXPECT_THAT(strict.status().message(), HasSubstr("init_from.strict false"));

  spec.mutable_init_from()->set_strict(false);
  auto loose = ReferenceTrainer::Create(spec);
  ASSERT_TRUE(loose.ok()) << loose.status();
  EXPECT_THAT((*loose)->init_summary(),
              HasSubstr("kept from the seed (not in the file): layers.4.bias"));
  const State got = Snapshot((*loose)->StateTensors());
  const State want = Snapshot((*source)->model().StateTensors());
  EXPECT_EQ(got.at("layers.0.weight"), want.at("layers.0.weight"));
  EXPECT_NE(got.at("layers.4.bias"), want.at("layers.4.bias"));

  // Each stage judges its own layers; the last also the foreign names, so
  // the two-stage pipeline reports the same as the whole model.
  auto pipeline = InProcessPipeline::Create(spec, OptionsFromSpec(spec));
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  EXPECT_EQ((*pipeline)->init_summary(), (*loose)->init_summary());
}

// A safetensors file of any dtypes, written by hand: WriteSafetensors
// holds F32 and I32 only. Each tensor is (name, dtype, shape, bytes).
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
void WriteRawSafetensors(const std::string& path,
                         const std::vector<RawTensor>& tensors) {
  std::string json = "{", data;
  for (const RawTensor& t : tensors) {
    if (json.size() > 1) json += ",";
    absl::StrAppend(&json, "\"", t.name, "\":{\"dtype\":\"", t.dtype,
                    "\",\"shape\":[", absl::StrJoin(t.shape, ","),
                    "],\"data_offsets\":[", data.size(), ",",
                    data.size() + t.bytes.size(), "]}");
    data += t.bytes;
  }
  json += "}";
  std::string length(8, '\0');
  for (int i = 0; i < 8; ++i)
    length[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << length << json << data;
}

RawTensor RawOf(const std::string& name, const Tensor& t) {
  const Tensor host = t.To(Device::kCpu);
  return {name, "F32", host.shape().dims(),
          std::string(reinterpret_cast<const char*>(host.f32()),
                      host.numel() * sizeof(float))};
}

// What a PyTorch user brings: a state_dict's names (no "layers."), a
// BatchNorm's I64 num_batches_tracked, half-precision weights, a file
// torch.save wrote. Each refusal says what to do.
TEST_F(InitWeightsTest, PyTorchsFilesAreJudgedByNameAndDtypeWithAFix) {
  auto source = ReferenceTrainer::Create(spec_);
  ASSERT_TRUE(source.ok());
  std::vector<RawTensor> ours, unprefixed;
  for (const NamedTensor& n : (*source)->model().StateTensors()) {
    ours.push_back(RawOf(n.name, *n.tensor));
    unprefixed.push_back(
        RawOf(n.name.substr(std::string("layers.").size()), *n.tensor));
  }
  const auto init = [&](const std::string& name,
                        const std::vector<RawTensor>& tensors, bool strict) {
    const std::string path = (dir_ / name).string();
    WriteRawSafetensors(path, tensors);
    gpipe::v1::JobSpec spec = spec_;
    spec.mutable_init_from()->set_path(path);
    spec.mutable_init_from()->set_strict(strict);
    return InProcessPipeline::Create(spec, OptionsFromSpec(spec)).status();
  };
  // Stage 0 refuses first, and the error is the whole model's: every
  // missing tensor, the file's foreign names, and the missing prefix (it
  // named only the stage's own two missing tensors once).
  absl::Status s = init("names.safetensors", unprefixed, true);
  EXPECT_THAT(s.message(), HasSubstr("missing 6: layers.0.weight, "
                                     "layers.0.bias"));
  EXPECT_THAT(s.message(), HasSubstr("not in the model 6: 0.bias, 0.weight"));
  EXPECT_THAT(s.message(), HasSubstr("lack the \"layers.\" prefix"));
  // BatchNorm's I64 step counter is no mismatch, strict or not (the file
  // was refused for its dtype once, then strict refused it as an extra,
  // and `strict false` to get past it hid real mismatches); another I64
  // extra still is one.
  std::vector<RawTensor> counted = ours;
  counted.push_back(
      {"layers.1.num_batches_tracked", "I64", {}, std::string(8, '\0')});
  EXPECT_TRUE(init("counted.safetensors", counted, false).ok());
  EXPECT_TRUE(init("counted.safetensors", counted, true).ok());
  counted.push_back({"layers.1.steps", "I64", {}, std::string(8, '\0')});
  EXPECT_THAT(init("counted.safetensors", counted, true).message(),
              HasSubstr("not in the model 1: layers.1.steps"));
  // A weight in half precision names the conversion.
  std::vector<RawTensor> half = ours;
  for (RawTensor& t : half) {
    if (t.name == "layers.0.weight") {
      t.dtype = "F16";
      t.bytes.resize(t.bytes.size() / 2);
    }
  }
  EXPECT_THAT(init("half.safetensors", half, true).message(),
              HasSubstr("layers.0.weight is F16 in the file, float32 [16, 8] "
                        "in the model (convert it: float32, .float()"));
  // torch.save's zip archive.
  const std::string pt = (dir_ / "model.pt").string();
  std::ofstream(pt, std::ios::binary) << "PK\x03\x04" << std::string(64, 'x');
  gpipe::v1::JobSpec spec = spec_;
  spec.mutable_init_from()->set_path(pt);
  EXPECT_THAT(ReferenceTrainer::Create(spec).status().message(),
              HasSubstr("it is a zip archive, as torch.save"));
  // A text file named by mistake is called what it is not: its first
  // eight bytes read as a header length said nothing a user could act on.
  const std::string text = (dir_ / "notes.txt").string();
  std::ofstream(text) << "These are my notes, not weights.\n";
  spec.mutable_init_from()->set_path(text);
  EXPECT_THAT(ReferenceTrainer::Create(spec).status().message(),
              HasSubstr("init_from.path: not a safetensors model file: " +
                        text + ": header length"));
  // A damaged safetensors file whose header length starts with 0x80 is not
  // called a pickle: its length fits the file.
  const std::string damaged = (dir_ / "damaged.safetensors").string();
  std::ofstream(damaged, std::ios::binary)
      << std::string("\x80\0\0\0\0\0\0\0", 8) << std::string(200, 'x');
  spec.mutable_init_from()->set_path(damaged);
  const absl::Status damaged_status = ReferenceTrainer::Create(spec).status();
  EXPECT_FALSE(damaged_status.ok());
  EXPECT_THAT(damaged_status.message(), ::testing::Not(HasSubstr("pickle")));
}

TEST_F(InitWeightsTest, AnotherShapeIsAnErrorEvenWhenNotStrict) {
  const Tensor wrong = Tensor::Zeros(Shape{16, 7}, DType::kF32);
  const std::string path = (dir_ / "wrong.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path, {{"layers.0.weight", &wrong}}, {}).ok());
  gpipe::v1::JobSpec spec = spec_;
  spec.mutable_init_from()->set_path(path);
  spec.mutable_init_from()->set_strict(false);
  auto t = ReferenceTrainer::Create(spec);
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(),
              HasSubstr("layers.0.weight is float32 [16, 7] in the file, "
                        "float32 [16, 8] in the model"));
}

// A stage judges its own layers; the pipeline's error names every tensor
// of the model that does not fit, or is missing, as one process does (the
// first stage's error named its own tensors only).
TEST_F(InitWeightsTest, APipelinesErrorNamesTheWholeModelsTensors) {
  const Tensor w0 = Tensor::Zeros(Shape{16, 7}, DType::kF32);
  const Tensor w4 = Tensor::Zeros(Shape{3, 15}, DType::kF32);
  const std::string wrong = (dir_ / "wrong_both.safetensors").string();
  ASSERT_TRUE(
      WriteSafetensors(wrong,
                       {{"layers.0.weight", &w0}, {"layers.4.weight", &w4}}, {})
          .ok());
  gpipe::v1::JobSpec spec = spec_;
  spec.mutable_init_from()->set_path(wrong);
  spec.mutable_init_from()->set_strict(false);
  auto whole = ReferenceTrainer::Create(spec);
  ASSERT_FALSE(whole.ok());
  auto pipeline = InProcessPipeline::Create(spec, OptionsFromSpec(spec));
  ASSERT_FALSE(pipeline.ok());
  EXPECT_EQ(pipeline.status().message(), whole.status().message());
  EXPECT_THAT(pipeline.status().message(),
              HasSubstr("2 tensors do not fit the model"));
  EXPECT_THAT(pipeline.status().message(), HasSubstr("layers.4.weight"));

  // Missing tensors of both stages, strict.
  auto source = ReferenceTrainer::Create(spec_);
  ASSERT_TRUE(source.ok());
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const NamedTensor& n : (*source)->model().StateTensors()) {
    if (n.name != "layers.0.bias" && n.name != "layers.4.bias")
      tensors.emplace_back(n.name, n.tensor);
  }
  const std::string partial = (dir_ / "partial_both.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(partial, tensors, {}).ok());
  spec.mutable_init_from()->set_path(partial);
  spec.mutable_init_from()->set_strict(true);
  pipeline = InProcessPipeline::Create(spec, OptionsFromSpec(spec));
  ASSERT_FALSE(pipeline.ok());
  EXPECT_THAT(pipeline.status().message(),
              HasSubstr("missing 2: layers.0.bias, layers.4.bias"));
  EXPECT_THAT(pipeline.status().message(),
              ::testing::Not(HasSubstr("this stage's")));
}

// A weight that is not a number would poison every step and be written
// back out at the end: the file is refused, naming the tensor and element.
TEST_F(InitWeightsTest, ANonFiniteWeightIsRefused) {
  Tensor weight = Tensor::Zeros(Shape{16, 8}, DType::kF32);
  weight.f32()[5] = std::nanf("");
  const std::string path = (dir_ / "nan.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path, {{"layers.0.weight", &weight}}, {}).ok());
  gpipe::v1::JobSpec spec = spec_;
  spec.mutable_init_from()->set_path(path);
  spec.mutable_init_from()->set_strict(false);
  auto t = ReferenceTrainer::Create(spec);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  EXPECT_THAT(t.status().message(),
              HasSubstr("tensor layers.0.weight holds nan at element 5 "
                        "(weights must be finite)"));
}

// A FIFO where the weights should be is refused at once: the hint about
// other formats opened it with a blocking open, which hung the worker and
// the controller's submit until someone wrote to it.
TEST_F(InitWeightsTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  const std::string fifo = (dir_ / "weights.safetensors").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::StatusOr<InitWeights> file = ReadInitWeights(fifo);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("not a regular file"));
  // A checkpoint folder whose stage file is a FIFO likewise.
  absl::StatusOr<InitWeights> folder = ReadInitWeights(dir_.string());
  ASSERT_FALSE(folder.ok());
  EXPECT_THAT(folder.status().message(), HasSubstr("not a regular file"));
}

TEST_F(InitWeightsTest, ADirectoryOfStageFilesIsOneCheckpoint) {
  auto source = ReferenceTrainer::Create(spec_);
  ASSERT_TRUE(source.ok());
  ASSERT_TRUE((*source)->Step().ok());
  const std::filesystem::path ckpt = dir_ / "ckpt";
  std::filesystem::create_directories(ckpt);
  std::vector<std::pair<std::string, const Tensor*>> a, b;
  for (const NamedTensor& n : (*source)->model().StateTensors()) {
    (n.name < "layers.3" ? a : b).emplace_back(n.name, n.tensor);
  }
  ASSERT_TRUE(WriteSafetensors((ckpt / "stage-0.safetensors").string(), a,
                               {{"step", "1"}})
                  .ok());
  ASSERT_TRUE(WriteSafetensors((ckpt / "stage-1.safetensors").string(), b,
                               {{"step", "1"}})
                  .ok());
  auto weights = ReadInitWeights(ckpt.string());
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->step, 1);
  EXPECT_EQ(weights->tensors.size(), a.size() + b.size());

  // The same name in two files, or two steps, is refused.
  ASSERT_TRUE(WriteSafetensors((ckpt / "stage-2.safetensors").string(), b,
                               {{"step", "2"}})
                  .ok());
  auto twice = ReadInitWeights(ckpt.string());
  ASSERT_FALSE(twice.ok());
  EXPECT_THAT(twice.status().message(), HasSubstr("init_from.path: "));
  // Of one step: the tensor and both its files are named.
  ASSERT_TRUE(WriteSafetensors((ckpt / "stage-2.safetensors").string(), b,
                               {{"step", "1"}})
                  .ok());
  auto same_step = ReadInitWeights(ckpt.string());
  ASSERT_FALSE(same_step.ok());
  EXPECT_THAT(same_step.status().message(),
              HasSubstr(absl::StrCat(
                  "is in two files (", (ckpt / "stage-1.safetensors").string(),
                  " and ", (ckpt / "stage-2.safetensors").string(), ")")));
  EXPECT_THAT(ReadInitWeights((dir_ / "none").string()).status().message(),
              HasSubstr("no such file or directory"));
}

// A committed checkpoint's directory is read by its manifest: a file that
// no longer matches its digest, or one of another step put in its place,
// is refused (both trained before), as is a model file of a later format.
TEST_F(InitWeightsTest, ACheckpointIsCheckedAgainstItsManifest) {
  auto source = ReferenceTrainer::Create(spec_);
  ASSERT_TRUE(source.ok());
  ASSERT_TRUE((*source)->Step().ok());
  const std::filesystem::path ckpt = dir_ / "committed";
  std::filesystem::create_directories(ckpt);
  std::vector<std::pair<std::string, const Tensor*>> all;
  for (const NamedTensor& n : (*source)->model().StateTensors()) {
    all.emplace_back(n.name, n.tensor);
  }
  const std::string file = (ckpt / "e1-stage-0.safetensors").string();
  const auto commit = [&](int64_t file_step, int64_t manifest_step) {
    EXPECT_TRUE(
        WriteSafetensors(file, all, {{"step", absl::StrCat(file_step)}}).ok());
    gpipe::v1::CheckpointManifest m;
    m.set_job_id("job-1");
    m.set_step(manifest_step);
    m.set_epoch(1);
    gpipe::v1::CheckpointFile* f = m.add_files();
    f->set_path("e1-stage-0.safetensors");
    f->set_sha256(storage::Sha256File(file).value());
    f->set_bytes(static_cast<int64_t>(std::filesystem::file_size(file)));
    f->set_layer_end(4);
    EXPECT_TRUE(
        storage::WriteManifest((ckpt / storage::kManifestName).string(), m)
            .ok());
  };
  commit(1, 1);
  auto weights = ReadInitWeights(ckpt.string());
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->step, 1);
  commit(1, 2);
  EXPECT_THAT(ReadInitWeights(ckpt.string()).status().message(),
              HasSubstr("e1-stage-0.safetensors is of step 1, its manifest's "
                        "is 2"));
  commit(1, 1);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  EXPECT_THAT(ReadInitWeights(ckpt.string()).status().message(),
              HasSubstr("does not match its manifest's sha256"));

  const std::string later = (dir_ / "later.safetensors").string();
  ASSERT_TRUE(
      WriteSafetensors(later, all,
                       {{"gpipe.format_version", "2"}, {"gpipe.step", "1"}})
          .ok());
  EXPECT_THAT(ReadInitWeights(later).status().message(),
              HasSubstr("model format version 2 is newer than this gpipe "
                        "reads"));
}

TEST_F(InitWeightsTest, ResolvingRefusesAFileWithoutAStepToContinue) {
  const std::string path =
      TrainAndSave(2, "nostep.safetensors", true, {{"format", "pt"}});
  gpipe::v1::JobSpec spec = spec_;
  spec.mutable_init_from()->set_path(path);
  spec.mutable_init_from()->set_optimizer_state(true);
  const absl::Status s = ResolveDataDependentFields(&spec);
  EXPECT_THAT(s.message(), HasSubstr("records no step to continue from"));
  // And a job must have steps left after the step it continues from.
  const std::string late = TrainAndSave(2, "late.safetensors", true);
  spec.mutable_init_from()->set_path(late);
  spec.set_steps(2);
  EXPECT_THAT(ResolveDataDependentFields(&spec).message(),
              HasSubstr("steps: 2 must be more than the step 2"));
}

// What `gpipectl eval` computes from a model file equals what the run that
// wrote it evaluated, bitwise, on the reference trainer and on the pipeline.
TEST_F(InitWeightsTest, AModelFileServedEvaluatesAsItsRunDid) {
  for (int64_t stages : {1, 2}) {
    std::unique_ptr<Trainer> trained;
    if (stages == 1) {
      auto t = ReferenceTrainer::Create(spec_);
      ASSERT_TRUE(t.ok());
      trained = std::move(*t);
    } else {
      auto p = InProcessPipeline::Create(spec_, OptionsFromSpec(spec_));
      ASSERT_TRUE(p.ok());
      trained = std::move(*p);
    }
    while (trained->step() < spec_.steps()) ASSERT_TRUE(trained->Step().ok());
    auto before = trained->Evaluate(Split::kTest, 0);
    ASSERT_TRUE(before.ok());
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    const std::vector<NamedTensor> state = trained->StateTensors();
    for (const NamedTensor& n : state) tensors.emplace_back(n.name, n.tensor);
    const std::string path =
        (dir_ / absl::StrCat("model", stages, ".safetensors")).string();
    ASSERT_TRUE(WriteSafetensors(path, tensors,
                                 ModelFileMetadata(spec_, trained->step()))
                    .ok());

    auto served = SpecToServe(path, "");
    ASSERT_TRUE(served.ok()) << served.status();
    EXPECT_EQ(served->init_from().path(), path);
    std::unique_ptr<Trainer> loaded;
    if (stages == 1) {
      auto t = ReferenceTrainer::Create(*served);
      ASSERT_TRUE(t.ok()) << t.status();
      loaded = std::move(*t);
    } else {
      auto p = InProcessPipeline::Create(*served, OptionsFromSpec(*served));
      ASSERT_TRUE(p.ok()) << p.status();
      loaded = std::move(*p);
    }
    auto after = loaded->Evaluate(Split::kTest, 0);
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(after->loss, before->loss) << stages;
    EXPECT_EQ(after->accuracy, before->accuracy) << stages;
    EXPECT_EQ(after->counted, before->counted);
  }
  // The folder train --out and fetch write serves as its model file does;
  // a folder without one is named as such.
  const std::filesystem::path folder = dir_ / "out";
  std::filesystem::create_directories(folder);
  std::filesystem::copy_file(dir_ / "model1.safetensors",
                             folder / "model.safetensors");
  auto from_folder = SpecToServe(folder.string(), "");
  ASSERT_TRUE(from_folder.ok()) << from_folder.status();
  EXPECT_EQ(from_folder->init_from().path(),
            (folder / "model.safetensors").string());
  std::filesystem::create_directories(dir_ / "empty");
  EXPECT_THAT(SpecToServe((dir_ / "empty").string(), "").status().message(),
              HasSubstr("a directory with no model.safetensors in it"));
  // Not a model file: a checkpoint's stage file has no job.
  const std::string stage_file = TrainAndSave(1, "stage.safetensors", true);
  EXPECT_THAT(ReadModelFileInfo(stage_file).status().message(),
              HasSubstr("not a model file gpipe wrote"));
  // Weights that record no job (another tool's, gpipe.from_torch's) are
  // served by a job's spec given with them, as it would start from them:
  // evaluated before any training. Its parameters are the stage file's.
  const std::string job_json = (dir_ / "job.json").string();
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(spec_, &json).ok());
  std::ofstream(job_json) << json;
  auto foreign = SpecToServe(stage_file, job_json);
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  EXPECT_EQ(foreign->init_from().path(), stage_file);
  EXPECT_TRUE(foreign->init_from().strict());
  auto serving = ReferenceTrainer::Create(*foreign);
  ASSERT_TRUE(serving.ok()) << serving.status();
  auto trained = ReferenceTrainer::Create(spec_);
  ASSERT_TRUE(trained.ok());
  ASSERT_TRUE((*trained)->Step().ok());  // the stage file's one step
  auto want = (*trained)->Evaluate(Split::kTest, 0);
  auto got = (*serving)->Evaluate(Split::kTest, 0);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(got->loss, want->loss);
  // A model file whose record cannot be read is refused for that, not
  // served as another tool's weights with JOB.json's preprocessing.
  const std::string unreadable =
      TrainAndSave(1, "unreadable.safetensors", false,
                   {{"gpipe.job", "{not json"}, {"gpipe.step", "1"}});
  EXPECT_THAT(SpecToServe(unreadable, job_json).status().message(),
              HasSubstr("its gpipe.job"));
  // A step without its job records no job either: served with JOB.json,
  // as the message for it says (it was refused again with the same one).
  const std::string step_only =
      TrainAndSave(1, "step-only.safetensors", false, {{"gpipe.step", "1"}});
  EXPECT_THAT(SpecToServe(step_only, "").status().message(),
              HasSubstr(": no gpipe.job in its metadata"));
  auto step_only_served = SpecToServe(step_only, job_json);
  EXPECT_TRUE(step_only_served.ok()) << step_only_served.status();
}

// A model file records its vocabulary twice, in gpipe.job and as
// gpipe.vocabulary (the Python package reads that first): records that
// disagree are refused, and the list serves a job that recorded none.
TEST_F(InitWeightsTest, TheTwoVocabularyRecordsMustAgree) {
  gpipe::v1::JobSpec text;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  R"({"model": {"input": {"dtype": "INT32",
                                          "shape": {"dims": [8]}},
                                "layers": [{"embedding": {"vocabSize": 3,
                                                          "dim": 4,
                                                          "maxPositions": 8}},
                                           {"linear": {"inFeatures": 4,
                                                       "outFeatures": 3}}],
                                "loss": {"softmaxCrossEntropy": {}}},
                      "optimizer": {"lr": 0.1, "sgd": {}},
                      "data": {"text": {"path": "corpus.txt", "seqLen": 8,
                                        "vocabulary": "CiBh"}},
                      "batchSize": 2, "steps": 1})",
                  &text)
                  .ok());
  const auto write = [&](const gpipe::v1::JobSpec& spec,
                         const std::string& list) {
    std::string json;
    EXPECT_TRUE(google::protobuf::util::MessageToJsonString(spec, &json).ok());
    const std::string path = (dir_ / "vocabulary.safetensors").string();
    EXPECT_TRUE(WriteSafetensors(path, {},
                                 {{"gpipe.job", json},
                                  {"gpipe.step", "1"},
                                  {"gpipe.vocabulary", list}})
                    .ok());
    return ReadModelFileInfo(path);
  };
  auto agree = write(text, "[10, 32, 97]");
  ASSERT_TRUE(agree.ok()) << agree.status();
  EXPECT_EQ(agree->spec.data().text().vocabulary(), std::string("\n a", 3));
  EXPECT_THAT(write(text, "[10, 32, 98]").status().message(),
              HasSubstr("disagree from token id 2"));
  EXPECT_THAT(write(text, "[10, 97, 32]").status().message(),
              HasSubstr("entry 2 (32) is not above the one before it (97)"));
  EXPECT_THAT(write(text, "[10, 300]").status().message(),
              HasSubstr("entry 1 is \"300\", not a byte"));
  EXPECT_THAT(write(spec_, "[10]").status().message(),
              HasSubstr("its gpipe.job reads no text"));
  gpipe::v1::JobSpec unrecorded = text;
  unrecorded.mutable_data()->mutable_text()->clear_vocabulary();
  auto filled = write(unrecorded, "[10, 32, 98]");
  ASSERT_TRUE(filled.ok()) << filled.status();
  EXPECT_EQ(filled->spec.data().text().vocabulary(), std::string("\n b", 3));
}

// gpipe.preprocessing is what readers without a protobuf parser apply:
// one that disagrees with gpipe.job's data.normalize (an edited file) is
// refused, as gpipe applied the job's and other readers the other.
TEST_F(InitWeightsTest, TheTwoNormalizationRecordsMustAgree) {
  gpipe::v1::JobSpec normalized = spec_;
  gpipe::v1::Normalize& n = *normalized.mutable_data()->mutable_normalize();
  n.add_mean(0.25f);
  n.add_std(0.1f);
  const auto write = [&](const gpipe::v1::JobSpec& spec,
                         std::optional<std::string> preprocessing) {
    std::map<std::string, std::string> metadata = ModelFileMetadata(spec, 1);
    if (preprocessing)
      metadata["gpipe.preprocessing"] = *preprocessing;
    else
      metadata.erase("gpipe.preprocessing");
    const std::string path = (dir_ / "normalized.safetensors").string();
    EXPECT_TRUE(WriteSafetensors(path, {}, metadata).ok());
    return ReadModelFileInfo(path);
  };
  // As written, and without the record (another tool's file).
  const std::map<std::string, std::string> written =
      ModelFileMetadata(normalized, 1);
  ASSERT_TRUE(written.count("gpipe.preprocessing"));
  EXPECT_TRUE(write(normalized, written.at("gpipe.preprocessing")).ok());
  EXPECT_TRUE(write(normalized, std::nullopt).ok());
  // Reformatted by a JSON tool: the same numbers.
  EXPECT_TRUE(
      write(normalized, R"({"normalize":{"mean":[0.25],"std":[0.100000001]}})")
          .ok());
  for (const char* edited :
       {R"({"normalize": {"mean": [0.25], "std": [0]}})",
        R"({"normalize": {"mean": [1, 2], "std": [0.1, 0.1]}})"}) {
    EXPECT_THAT(write(normalized, edited).status().message(),
                HasSubstr("gpipe.preprocessing and gpipe.job's "
                          "data.normalize disagree"))
        << edited;
  }
  EXPECT_THAT(write(spec_, R"({"normalize": {"mean": [0], "std": [1]}})")
                  .status()
                  .message(),
              HasSubstr("disagree"));
  EXPECT_THAT(write(normalized, "{\"normalize\": 3").status().message(),
              HasSubstr("gpipe.preprocessing is not"));
}

}  // namespace
}  // namespace gpipe
