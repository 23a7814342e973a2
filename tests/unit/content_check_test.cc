// The submit-time check of a job's data and starting weights: the state
// names and shapes the controller derives from the spec are the ones a
// built model and its optimizer hold (every layer kind), and a NaN feature,
// a label past the head's classes or a weight of another shape is refused
// with the stages' own message.
#include "services/pipeline/content_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/nn/layer_spec.h"
#include "services/nn/model.h"
#include "services/nn/optimizer.h"
#include "services/pipeline/job_spec.h"
#include "services/storage/safetensors.h"
#include "tests/support/npy_file.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

// Every layer kind that holds state, with and without the optional parts.
constexpr char kCnn[] = R"({
  "input": {"dtype": "FLOAT32", "shape": {"dims": [2, 6, 6]}},
  "layers": [
    {"conv2d": {"in_channels": 2, "out_channels": 4, "kernel_size": 3,
                "padding": 1}},
    {"batch_norm": {"features": 4}},
    {"relu": {}},
    {"conv2d": {"in_channels": 4, "out_channels": 3, "kernel_size": 3,
                "bias": false}},
    {"max_pool2d": {"kernel_size": 2}},
    {"flatten": {}},
    {"linear": {"in_features": 12, "out_features": 8, "bias": false}},
    {"layer_norm": {"features": 8}},
    {"linear": {"in_features": 8, "out_features": 3}}
  ],
  "loss": {"softmax_cross_entropy": {}}
})";

constexpr char kTransformer[] = R"({
  "input": {"dtype": "INT32", "shape": {"dims": [8]}},
  "layers": [
    {"embedding": {"vocab_size": 11, "dim": 16, "max_positions": 8}},
    {"transformer_block": {"dim": 16, "heads": 2}},
    {"transformer_block": {"dim": 16, "heads": 4, "mlp_hidden": 24}},
    {"self_attention": {"dim": 16, "heads": 2, "causal": false}},
    {"layer_norm": {"features": 16}},
    {"linear": {"in_features": 16, "out_features": 11}}
  ],
  "loss": {"softmax_cross_entropy": {}}
})";

gpipe::v1::ModelSpec ParseModel(const char* json) {
  absl::StatusOr<gpipe::v1::JobSpec> spec =
      ParseJobSpecJson(absl::StrCat(R"({"model": )", json,
                                    R"(, "optimizer": {"lr": 0.1, "sgd": {}},
                        "data": {"synthetic": {}}, "batch_size": 4,
                        "steps": 1})"),
                       SpecCheck::kJsonOnly);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? spec->model() : gpipe::v1::ModelSpec();
}

TEST(ContentCheckTest, StateShapesAreTheBuiltModelsAndOptimizers) {
  for (const char* json : {kCnn, kTransformer}) {
    const gpipe::v1::ModelSpec spec = ParseModel(json);
    absl::StatusOr<std::vector<StateShape>> shapes = ModelStateShapes(spec);
    ASSERT_TRUE(shapes.ok()) << shapes.status();
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Build(spec, 1);
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<NamedTensor> built = (*model)->StateTensors();
    ASSERT_EQ(shapes->size(), built.size());
    std::vector<std::string> parameters;
    for (size_t i = 0; i < built.size(); ++i) {
      EXPECT_EQ((*shapes)[i].name, built[i].name);
      EXPECT_EQ((*shapes)[i].shape, built[i].tensor->shape()) << built[i].name;
      if ((*shapes)[i].parameter) parameters.push_back((*shapes)[i].name);
    }
    // Buffers are no parameters: exactly the built model's parameters.
    std::vector<std::string> built_parameters;
    for (const NamedParameter& p : (*model)->Parameters()) {
      built_parameters.push_back(p.name);
    }
    EXPECT_EQ(parameters, built_parameters);
    for (const char* optimizer : {R"({"lr": 0.1, "sgd": {}})",
                                  R"({"lr": 0.1, "sgd": {"momentum": 0.9}})",
                                  R"({"lr": 0.1, "adamw": {}})"}) {
      absl::StatusOr<gpipe::v1::JobSpec> o =
          ParseJobSpecJson(absl::StrCat(R"({"optimizer": )", optimizer, "}"),
                           SpecCheck::kJsonOnly);
      ASSERT_TRUE(o.ok()) << o.status();
      absl::StatusOr<std::unique_ptr<Optimizer>> made =
          MakeOptimizer(o->optimizer(), (*model)->Parameters());
      ASSERT_TRUE(made.ok()) << made.status();
      std::vector<std::string> names;
      for (const std::string& p : parameters) {
        for (std::string& n : OptimizerStateNames(o->optimizer(), p)) {
          names.push_back(std::move(n));
        }
      }
      std::vector<std::string> made_names;
      for (const NamedTensor& t : (*made)->State()) {
        made_names.push_back(t.name);
      }
      std::sort(names.begin(), names.end());
      std::sort(made_names.begin(), made_names.end());
      EXPECT_EQ(names, made_names) << optimizer;
    }
  }
}

class ContentCheckFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("content_check_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // 40 samples of 4 floats, labels 0..2; `poison` makes sample 7's third
  // feature NaN, `label` replaces sample 9's label.
  gpipe::v1::JobSpec Spec(bool poison, int64_t label) {
    std::vector<float> x(40 * 4);
    for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * (i % 7);
    if (poison) x[7 * 4 + 2] = std::nanf("");
    std::vector<int64_t> y(40);
    for (size_t i = 0; i < y.size(); ++i) y[i] = i % 3;
    y[9] = label;
    Write("x.npy", test_support::NpyFile(
                       "<f4", "(40, 4)",
                       std::string(reinterpret_cast<const char*>(x.data()),
                                   x.size() * sizeof(float))));
    Write("y.npy", test_support::NpyFile(
                       "<i8", "(40,)",
                       std::string(reinterpret_cast<const char*>(y.data()),
                                   y.size() * sizeof(int64_t))));
    absl::StatusOr<gpipe::v1::JobSpec> spec = ParseJobSpecJson(absl::StrCat(
        R"({"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [4]}},
             "layers": [{"linear": {"in_features": 4, "out_features": 5}},
                        {"relu": {}},
                        {"linear": {"in_features": 5, "out_features": 3}}],
             "loss": {"softmax_cross_entropy": {}}},
            "optimizer": {"lr": 0.1, "adamw": {}},
            "data": {"tensors": {"inputs": ")",
        (dir_ / "x.npy").string(), R"(", "targets": ")",
        (dir_ / "y.npy").string(), R"("}},
            "batch_size": 8, "steps": 4})"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }
  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  std::filesystem::path dir_;
};

TEST_F(ContentCheckFilesTest, OnlyASpecNamingFilesOfItsOwnIsChecked) {
  absl::StatusOr<gpipe::v1::JobSpec> synthetic = ParseJobSpecJson(
      R"({"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [4]}},
           "layers": [{"linear": {"in_features": 4, "out_features": 3}}],
           "loss": {"softmax_cross_entropy": {}}},
          "optimizer": {"lr": 0.1, "sgd": {}},
          "data": {"synthetic": {"task": "CLASSES", "features": 4,
                                 "classes": 3, "train_samples": 64,
                                 "test_samples": 8}},
          "batch_size": 8, "steps": 4})");
  ASSERT_TRUE(synthetic.ok()) << synthetic.status();
  absl::StatusOr<std::optional<int64_t>> none = ContentCheckBytes(*synthetic);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  // A FIFO reads as 0 bytes, and is checked: refused, never waited on.
  gpipe::v1::JobSpec fifo = Spec(false, 1);
  const std::string path = (dir_ / "fifo.npy").string();
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  fifo.mutable_data()->mutable_tensors()->set_inputs(path);
  fifo.mutable_data()->mutable_tensors()->set_targets(path);
  absl::StatusOr<std::optional<int64_t>> zero = ContentCheckBytes(fifo);
  ASSERT_TRUE(zero.ok() && zero->has_value());
  EXPECT_EQ(**zero, 0);
  EXPECT_THAT(CheckJobContents(fifo).message(),
              HasSubstr("not a regular file"));
}

TEST_F(ContentCheckFilesTest, WhatTheStagesWouldRefuseIsRefused) {
  EXPECT_TRUE(CheckJobContents(Spec(false, 1)).ok());
  absl::Status nan = CheckJobContents(Spec(true, 1));
  EXPECT_THAT(nan.message(), HasSubstr("nan is not finite"));
  EXPECT_THAT(nan.message(), HasSubstr("(sample 7)"));
  absl::Status label = CheckJobContents(Spec(false, 5));
  EXPECT_THAT(label.message(), HasSubstr("fewer than the 6 classes"));

  // Starting weights: the right ones load, one of another shape is named.
  gpipe::v1::JobSpec spec = Spec(false, 1);
  Tensor w0 = Tensor::Zeros(Shape{5, 4}), b0 = Tensor::Zeros(Shape{5});
  Tensor w2 = Tensor::Zeros(Shape{3, 5}), b2 = Tensor::Zeros(Shape{3});
  Tensor wide = Tensor::Zeros(Shape{3, 6});
  // The model's four tensors, layer 2's weight as given.
  const auto weights = [&](const std::string& name, const Tensor* weight) {
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(WriteSafetensors(path,
                                 {{"layers.0.weight", &w0},
                                  {"layers.0.bias", &b0},
                                  {"layers.2.weight", weight},
                                  {"layers.2.bias", &b2}},
                                 {})
                    .ok());
    return path;
  };
  spec.mutable_init_from()->set_path(weights("good.safetensors", &w2));
  EXPECT_TRUE(CheckJobContents(spec).ok()) << CheckJobContents(spec);
  const std::string bad = weights("bad.safetensors", &wide);
  spec.mutable_init_from()->set_path(bad);
  absl::Status shape = CheckJobContents(spec);
  EXPECT_THAT(shape.message(), HasSubstr("layers.2.weight"));
  // What the check reads: both files and the model's state, 3 times over.
  absl::StatusOr<std::optional<int64_t>> bytes = ContentCheckBytes(spec);
  ASSERT_TRUE(bytes.ok() && bytes->has_value());
  EXPECT_GT(**bytes,
            static_cast<int64_t>(std::filesystem::file_size(dir_ / "x.npy") +
                                 std::filesystem::file_size(dir_ / "y.npy") +
                                 std::filesystem::file_size(bad)));
}

}  // namespace
}  // namespace gpipe
