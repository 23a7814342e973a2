// A stage's checkpoint: parameters, buffers and optimizer state by global
// layer index, so that the files of one partition restore a stage of any
// other; a corrupt file or a missing tensor is DataLoss.
#include "services/pipeline/stage_checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"
#include "services/storage/manifest.h"

namespace gpipe {
namespace {

namespace v1 = gpipe::v1;
using ::testing::HasSubstr;

constexpr char kSpec[] = R"({
  "name": "stage-checkpoint-test",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 16}},
      {"batchNorm": {"features": 16}},
      {"relu": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 16}},
      {"relu": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "adamw": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 64, "testSamples": 16}},
  "batchSize": 8,
  "steps": 10,
  "seed": 3
})";
constexpr int64_t kLayers = 6;

class StageCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(
        google::protobuf::util::JsonStringToMessage(kSpec, &spec_).ok());
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat(
               "stage_checkpoint_test-", getpid(), "-",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto dataset = OpenJobDataset(spec_);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    dataset_ = std::move(*dataset);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A stage over layers [begin, end), alone in its pipeline so that it
  // needs no links.
  std::unique_ptr<Stage> MakeStage(int64_t begin, int64_t end) {
    StagePlacement p;
    p.layer_begin = begin;
    p.layer_end = end;
    absl::StatusOr<std::unique_ptr<Stage>> stage =
        Stage::Create(spec_, p, dataset_, nullptr, nullptr);
    EXPECT_TRUE(stage.ok()) << stage.status();
    return stage.ok() ? std::move(*stage) : nullptr;
  }

  // Every tensor a checkpoint holds, by name.
  static std::map<std::string, std::vector<float>> State(Stage& stage) {
    std::map<std::string, std::vector<float>> out;
    for (const NamedTensor& t : stage.model().StateTensors())
      out[t.name] = t.tensor->ToVector();
    for (const NamedTensor& t : stage.optimizer().State())
      out[t.name] = t.tensor->ToVector();
    return out;
  }

  // Gives every state tensor distinct values (the optimizer's moments are
  // zero after construction, which would prove nothing).
  static void Scribble(Stage& stage, float base) {
    std::vector<NamedTensor> all = stage.model().StateTensors();
    for (const NamedTensor& t : stage.optimizer().State()) all.push_back(t);
    for (const NamedTensor& t : all) {
      float* v = t.tensor->f32();
      for (int64_t i = 0; i < t.tensor->numel(); ++i) v[i] = base + i;
      base += 1000;
    }
  }

  std::string Save(Stage& stage, int64_t step, v1::CheckpointManifest* m) {
    const std::string path =
        (dir_ / absl::StrCat("stage-", m->files_size(), ".safetensors"))
            .string();
    absl::StatusOr<WrittenCheckpoint> written =
        SaveStageCheckpoint(stage, step, path);
    EXPECT_TRUE(written.ok()) << written.status();
    v1::CheckpointFile* f = m->add_files();
    f->set_path(std::filesystem::path(path).filename().string());
    f->set_sha256(written->sha256);
    f->set_bytes(written->bytes);
    f->set_stage(m->files_size() - 1);
    f->set_layer_begin(stage.placement().layer_begin);
    f->set_layer_end(stage.placement().layer_end);
    return path;
  }

  v1::JobSpec spec_;
  std::shared_ptr<const Dataset> dataset_;
  std::filesystem::path dir_;
};

TEST_F(StageCheckpointTest, AnyPartitionRestoresFromAnyOther) {
  // Saved as two stages, [0, 2) and [2, 6).
  std::unique_ptr<Stage> a = MakeStage(0, 2);
  std::unique_ptr<Stage> b = MakeStage(2, kLayers);
  Scribble(*a, 1);
  Scribble(*b, 50000);
  v1::CheckpointManifest manifest;
  manifest.set_step(7);
  Save(*a, 7, &manifest);
  Save(*b, 7, &manifest);
  const std::string manifest_path = (dir_ / storage::kManifestName).string();
  ASSERT_TRUE(storage::WriteManifest(manifest_path, manifest).ok());
  std::map<std::string, std::vector<float>> saved = State(*a);
  saved.merge(State(*b));
  EXPECT_THAT(saved,
              ::testing::Contains(::testing::Key("layers.1.running_mean")));
  EXPECT_THAT(
      saved, ::testing::Contains(::testing::Key("layers.5.weight.exp_avg_sq")));

  // Restored as one stage, and as a middle stage [1, 4).
  std::unique_ptr<Stage> whole = MakeStage(0, kLayers);
  absl::StatusOr<int64_t> step = RestoreStageCheckpoint(*whole, manifest_path);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 7);
  EXPECT_EQ(State(*whole), saved);
  std::unique_ptr<Stage> middle = MakeStage(1, 4);
  ASSERT_TRUE(RestoreStageCheckpoint(*middle, manifest_path).ok());
  for (const auto& [name, values] : State(*middle)) {
    EXPECT_EQ(values, saved.at(name)) << name;
  }
}

TEST_F(StageCheckpointTest, CorruptOrIncompleteCheckpointIsDataLoss) {
  std::unique_ptr<Stage> a = MakeStage(0, 2);
  std::unique_ptr<Stage> b = MakeStage(2, kLayers);
  v1::CheckpointManifest manifest;
  manifest.set_step(4);
  Save(*a, 4, &manifest);
  const std::string b_path = Save(*b, 4, &manifest);
  const std::string manifest_path = (dir_ / storage::kManifestName).string();
  ASSERT_TRUE(storage::WriteManifest(manifest_path, manifest).ok());

  // A stage whose layers no file covers.
  v1::CheckpointManifest only_a = manifest;
  only_a.mutable_files()->RemoveLast();
  const std::string only_a_path = (dir_ / "only_a.json").string();
  ASSERT_TRUE(storage::WriteManifest(only_a_path, only_a).ok());
  std::unique_ptr<Stage> whole = MakeStage(0, kLayers);
  absl::Status s = RestoreStageCheckpoint(*whole, only_a_path).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("has no tensor layers."));

  // One flipped byte in a file.
  {
    std::fstream f(b_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  s = RestoreStageCheckpoint(*whole, manifest_path).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("stage-1.safetensors"));
  // The first stage's file is intact, and it alone is read for [0, 2).
  std::unique_ptr<Stage> first = MakeStage(0, 2);
  EXPECT_TRUE(RestoreStageCheckpoint(*first, manifest_path).ok());
}

// A checkpoint of another model (other widths) or one whose manifest points
// outside its directory is refused with DataLoss naming what is wrong; the
// stage's parameters are not half-overwritten by a shape mismatch.
TEST_F(StageCheckpointTest, CheckpointOfAnotherModelIsDataLoss) {
  // Layers 0 and 1 match; layer 3 and 5 do not.
  v1::JobSpec wider = spec_;
  wider.mutable_model()->mutable_layers(3)->mutable_linear()->set_out_features(
      32);
  wider.mutable_model()->mutable_layers(5)->mutable_linear()->set_in_features(
      32);
  StagePlacement p;
  p.layer_begin = 0;
  p.layer_end = kLayers;
  absl::StatusOr<std::unique_ptr<Stage>> other =
      Stage::Create(wider, p, dataset_, nullptr, nullptr);
  ASSERT_TRUE(other.ok()) << other.status();
  v1::CheckpointManifest manifest;
  manifest.set_step(3);
  Save(**other, 3, &manifest);
  const std::string manifest_path = (dir_ / storage::kManifestName).string();
  ASSERT_TRUE(storage::WriteManifest(manifest_path, manifest).ok());

  std::unique_ptr<Stage> mine = MakeStage(0, kLayers);
  Scribble(*mine, 7);
  const auto before = State(*mine);
  absl::Status s = RestoreStageCheckpoint(*mine, manifest_path).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("tensor layers.3."));
  EXPECT_THAT(s.message(), HasSubstr("another shape"));
  EXPECT_EQ(State(*mine), before);

  // A manifest that names a file outside its directory.
  for (const char* escape : {"../stage-0.safetensors", "/etc/passwd", ""}) {
    v1::CheckpointManifest bad = manifest;
    bad.mutable_files(0)->set_path(escape);
    const std::string bad_path = (dir_ / "bad.json").string();
    ASSERT_TRUE(storage::WriteManifest(bad_path, bad).ok());
    s = RestoreStageCheckpoint(*mine, bad_path).status();
    EXPECT_TRUE(absl::IsDataLoss(s)) << escape << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("not a plain path")) << escape;
  }
}

}  // namespace
}  // namespace gpipe
