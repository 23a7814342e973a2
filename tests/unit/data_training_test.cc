// A user's own data trains: three classes of points in a CSV table whose
// features differ in scale by 10^4 (learnable once standardized) and the same
// points as a safetensors file, each to a stated test accuracy through a
// two-stage pipeline; and what the CSV's standardization computed is in the
// spec, equal to the statistics of the training rows.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"
#include "services/storage/safetensors.h"

namespace gpipe {
namespace {

constexpr int kRows = 600;
constexpr int kFeatures = 4;

struct Points {
  std::vector<float> x;  // [kRows, kFeatures]
  std::vector<int32_t> y;
};

// Class c is centred at c on every feature, with unit noise; feature f is
// then scaled by 10^f, so unscaled SGD would only ever see the last one.
Points MakePoints() {
  std::mt19937 rng(11);
  std::normal_distribution<float> noise(0.0f, 0.35f);
  Points p;
  for (int i = 0; i < kRows; ++i) {
    const int c = i % 3;
    p.y.push_back(c);
    for (int f = 0; f < kFeatures; ++f) {
      p.x.push_back((c + noise(rng)) * std::pow(10.0f, f) + 5.0f);
    }
  }
  return p;
}

std::string Spec(const std::string& data, float lr) {
  return absl::StrCat(R"({
    "model": {
      "input": {"dtype": "FLOAT32", "shape": {"dims": [4]}},
      "layers": [
        {"linear": {"in_features": 4, "out_features": 16}},
        {"relu": {}},
        {"linear": {"in_features": 16, "out_features": 0}}
      ],
      "loss": {"softmax_cross_entropy": {}}
    },
    "optimizer": {"lr": )",
                      lr, R"(, "sgd": {"momentum": 0.9}},
    "data": )",
                      data, R"(,
    "pipeline": {"stages": 2, "micro_batches": 2},
    "batch_size": 32,
    "steps": 150,
    "seed": 3
  })");
}

double TrainAndTest(const gpipe::v1::JobSpec& spec) {
  auto p = InProcessPipeline::Create(spec, OptionsFromSpec(spec));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return 0;
  while ((*p)->step() < spec.steps()) {
    auto r = (*p)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return 0;
  }
  auto e = (*p)->Evaluate(Split::kTest, 0);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? e->accuracy : 0;
}

class DataTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("data_training_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(DataTrainingTest, AStandardizedCsvTableLearnsItsClasses) {
  const Points p = MakePoints();
  const std::string path = (dir_ / "points.csv").string();
  {
    std::ofstream out(path);
    out << "a,b,label,c,d\n";
    for (int i = 0; i < kRows; ++i) {
      const float* x = &p.x[i * kFeatures];
      out << x[0] << "," << x[1] << "," << p.y[i] << "," << x[2] << "," << x[3]
          << "\n";
    }
  }
  auto spec = ParseJobSpecJson(
      Spec(absl::StrCat(R"({"csv": {"path": ")", path,
                        R"(", "target": "label", "standardize": true}})"),
           0.05f));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().layers(2).linear().out_features(), 3);
  // Written at submit: the training rows' (the first 540) statistics.
  const auto& n = spec->data().normalize();
  ASSERT_EQ(n.mean_size(), kFeatures);
  for (int f = 0; f < kFeatures; ++f) {
    double sum = 0;
    for (int i = 0; i < 540; ++i) sum += p.x[i * kFeatures + f];
    EXPECT_NEAR(n.mean(f), sum / 540, 1e-3 * std::pow(10.0, f)) << f;
    EXPECT_GT(n.std(f), 0.5 * std::pow(10.0, f)) << f;
  }
  EXPECT_GE(TrainAndTest(*spec), 0.95);
}

TEST_F(DataTrainingTest, ASafetensorsFileOfPointsLearnsItsClasses) {
  const Points p = MakePoints();
  Tensor x = Tensor::Empty(Shape{kRows, kFeatures}, DType::kF32);
  Tensor y = Tensor::Empty(Shape{kRows}, DType::kI32);
  for (int i = 0; i < kRows; ++i) {
    y.i32()[i] = p.y[i];
    // Scaled to similar ranges by hand this time; normalize centres them.
    for (int f = 0; f < kFeatures; ++f) {
      x.f32()[i * kFeatures + f] = p.x[i * kFeatures + f] / std::pow(10.0f, f);
    }
  }
  const std::string path = (dir_ / "points.safetensors").string();
  ASSERT_TRUE(
      WriteSafetensors(path, {{"inputs", &x}, {"targets", &y}}, {}).ok());
  auto spec = ParseJobSpecJson(
      Spec(absl::StrCat(R"({"tensors": {"inputs": ")", path,
                        R"("}, "normalize": {"mean": [6], "std": [1]}})"),
           0.05f));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_GE(TrainAndTest(*spec), 0.95);
}

}  // namespace
}  // namespace gpipe
