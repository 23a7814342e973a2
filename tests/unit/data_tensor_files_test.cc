// Data sets saved as arrays (data.tensors): .npy and .safetensors inputs
// laid out in the model's input shape and converted to its dtype, targets
// per sample or per position, the test split from files or a fraction, and
// malformed data refused naming the field, the file and the value.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/tensor_files.h"
#include "services/storage/safetensors.h"
#include "tests/support/npy_file.h"

namespace gpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  std::string out(v.size() * sizeof(T), '\0');
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::string Npy(const std::string& descr, const std::string& shape,
                const std::string& data) {
  return test_support::NpyFile(descr, shape, data);
}

std::vector<float> Iota(int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

class TensorFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("tensor_files_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  // Opening `spec` must fail with InvalidArgument; returns the message.
  static std::string Error(const gpipe::v1::TensorFiles& spec,
                           const Shape& input = Shape{},
                           DType dtype = DType::kF32) {
    auto d = TensorFilesDataset::Open(spec, input, dtype);
    EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
    return std::string(d.status().message());
  }
  std::filesystem::path dir_;
};

TEST_F(TensorFilesTest, SamplesAreLaidOutInTheModelInput) {
  // Six samples of four uint8 "pixels", int64 labels; half are the test split.
  std::vector<uint8_t> pixels(24);
  for (int i = 0; i < 24; ++i) pixels[i] = static_cast<uint8_t>(10 * i);
  gpipe::v1::TensorFiles spec;
  spec.set_inputs(Write("x.npy", Npy("|u1", "(6, 4)", Bytes(pixels))));
  spec.set_targets(
      Write("y.npy", Npy("<i8", "(6,)", Bytes<int64_t>({0, 1, 2, 3, 4, 9}))));
  spec.set_test_fraction(0.5);
  auto d = TensorFilesDataset::Open(spec, Shape{1, 2, 2}, DType::kF32);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), 3);
  EXPECT_EQ((*d)->size(Split::kTest), 3);
  EXPECT_EQ((*d)->input_shape(), (Shape{1, 2, 2}));
  EXPECT_EQ((*d)->input_dtype(), DType::kF32);
  EXPECT_EQ((*d)->target_shape(), Shape{});
  EXPECT_EQ((*d)->num_classes(), 10);  // the largest id is in the test split
  EXPECT_EQ((*d)->num_input_ids(), 0);

  const Batch b = (*d)->Gather(Split::kTrain, {2, 0});
  EXPECT_EQ(b.inputs.shape(), (Shape{2, 1, 2, 2}));
  EXPECT_EQ(b.inputs.dtype(), DType::kF32);
  EXPECT_THAT(b.inputs.ToVector(),
              ElementsAre(80, 90, 100, 110, 0, 10, 20, 30));
  EXPECT_EQ(b.targets.shape(), (Shape{2}));
  EXPECT_EQ(b.targets.dtype(), DType::kI32);
  EXPECT_EQ(b.targets.i32()[0], 2);
  EXPECT_EQ(b.targets.i32()[1], 0);
  const Batch t = (*d)->Gather(Split::kTest, {2});
  EXPECT_EQ(t.inputs.f32()[3], 230);
  EXPECT_EQ(t.targets.i32()[0], 9);
  EXPECT_EQ((*d)->GatherTargets(Split::kTest, {0, 1}).i32()[1], 4);
}

TEST_F(TensorFilesTest, NoModelShapeKeepsTheFilesAndTheDefaultFraction) {
  gpipe::v1::TensorFiles spec;
  spec.set_inputs(Write(
      "x.npy", Npy("<f8", "(20, 2, 3)", Bytes(std::vector<double>(120, 0.5)))));
  std::vector<int32_t> y(20, 1);
  spec.set_targets(Write("y.npy", Npy("<i4", "(20,)", Bytes(y))));
  auto d = TensorFilesDataset::Open(spec, Shape{}, DType::kF32);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->input_shape(), (Shape{2, 3}));
  EXPECT_EQ((*d)->size(Split::kTrain), 18);  // test_fraction 0 means 0.1
  EXPECT_EQ((*d)->size(Split::kTest), 2);
  EXPECT_EQ((*d)->num_classes(), 2);
  EXPECT_EQ((*d)->Gather(Split::kTest, {1}).inputs.f32()[5], 0.5f);
}

TEST_F(TensorFilesTest, SeparateTestFiles) {
  gpipe::v1::TensorFiles spec;
  spec.set_inputs(Write("x.npy", Npy("<f4", "(4, 2)", Bytes(Iota(8)))));
  spec.set_targets(
      Write("y.npy", Npy("|u1", "(4,)", Bytes<uint8_t>({0, 1, 0, 1}))));
  spec.set_test_inputs(
      Write("tx.npy", Npy("<f4", "(2, 2)", Bytes<float>({-1, -2, -3, -4}))));
  spec.set_test_targets(
      Write("ty.npy", Npy("<i2", "(2,)", Bytes<int16_t>({4, -1}))));
  auto d = TensorFilesDataset::Open(spec, Shape{2}, DType::kF32);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), 4);
  EXPECT_EQ((*d)->size(Split::kTest), 2);
  EXPECT_EQ((*d)->num_classes(), 5);
  const Batch t = (*d)->Gather(Split::kTest, {1, 0});
  EXPECT_THAT(t.inputs.ToVector(), ElementsAre(-3, -4, -1, -2));
  EXPECT_EQ(t.targets.i32()[0], -1);
  EXPECT_EQ(t.targets.i32()[1], 4);
  EXPECT_EQ((*d)->Gather(Split::kTrain, {3}).inputs.f32()[1], 7);

  // Test files whose samples disagree with the train files'.
  spec.set_test_inputs(Write("tx3.npy", Npy("<f4", "(2, 3)", Bytes(Iota(6)))));
  const std::string shape = Error(spec, Shape{2});
  EXPECT_THAT(shape, HasSubstr("test_inputs: "));
  EXPECT_THAT(shape, HasSubstr("samples are [3], but [2]"));
  // One test file without the other.
  spec.clear_test_targets();
  EXPECT_THAT(Error(spec, Shape{2}),
              HasSubstr("test_targets: required with test_inputs"));
}

TEST_F(TensorFilesTest, OneSafetensorsFileHoldsInputsAndTargets) {
  const Tensor x = Tensor::FromVector(Shape{4, 3}, Iota(12));
  const Tensor y = Tensor::FromInts(Shape{4}, {3, 1, 0, 2});
  const std::string path = (dir_ / "d.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path, {{"inputs", &x}, {"targets", &y}}).ok());
  const std::string renamed = (dir_ / "r.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(renamed, {{"pixels", &x}, {"labels", &y}}).ok());

  gpipe::v1::TensorFiles spec;
  spec.set_inputs(path);
  spec.set_test_fraction(0.25);
  auto d = TensorFilesDataset::Open(spec, Shape{3}, DType::kF32);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), 3);
  EXPECT_EQ((*d)->num_classes(), 4);
  const Batch t = (*d)->Gather(Split::kTest, {0});
  EXPECT_THAT(t.inputs.ToVector(), ElementsAre(9, 10, 11));
  EXPECT_EQ(t.targets.i32()[0], 2);

  spec.set_inputs(renamed);
  const std::string missing = Error(spec, Shape{3});
  EXPECT_THAT(missing, HasSubstr("inputs: " + renamed));
  EXPECT_THAT(missing, HasSubstr("no tensor \"inputs\""));
  EXPECT_THAT(missing, HasSubstr("\"labels\", \"pixels\""));
  spec.set_input_key("pixels");
  spec.set_target_key("labels");
  auto r = TensorFilesDataset::Open(spec, Shape{3}, DType::kF32);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->Gather(Split::kTrain, {1}).targets.i32()[0], 1);
  // A target key the file lacks is that field's mistake, not the inputs'.
  spec.set_target_key("label");
  const std::string no_target = Error(spec, Shape{3});
  EXPECT_THAT(no_target, HasSubstr("target_key: " + renamed));
  EXPECT_THAT(no_target, HasSubstr("no tensor \"label\""));
  spec.set_target_key("labels");

  // Only a safetensors file can hold the targets too.
  spec.set_inputs(Write("x.npy", Npy("<f4", "(4, 3)", Bytes(Iota(12)))));
  EXPECT_THAT(Error(spec, Shape{3}),
              HasSubstr("targets: required unless inputs is a .safetensors"));
}

TEST_F(TensorFilesTest, TokenIdsWithATargetPerPosition) {
  // Sequences of 3 int64 token ids for an embedding, targets [N, 3] with -1
  // where nothing is predicted.
  gpipe::v1::TensorFiles spec;
  spec.set_inputs(Write(
      "x.npy", Npy("<i8", "(2, 3)", Bytes<int64_t>({5, 6, 7, 8, 40, 9}))));
  spec.set_targets(Write(
      "y.npy", Npy("<i4", "(2, 3)", Bytes<int32_t>({6, 7, -1, 40, 9, -1}))));
  spec.set_test_inputs(spec.inputs());
  spec.set_test_targets(spec.targets());
  auto d = TensorFilesDataset::Open(spec, Shape{}, DType::kI32);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->input_dtype(), DType::kI32);
  EXPECT_EQ((*d)->input_shape(), (Shape{3}));
  EXPECT_EQ((*d)->target_shape(), (Shape{3}));
  EXPECT_EQ((*d)->num_classes(), 41);
  EXPECT_EQ((*d)->num_input_ids(), 41);
  const Batch b = (*d)->Gather(Split::kTrain, {1});
  EXPECT_EQ(b.inputs.shape(), (Shape{1, 3}));
  EXPECT_EQ(b.inputs.i32()[1], 40);
  EXPECT_EQ(b.targets.shape(), (Shape{1, 3}));
  EXPECT_EQ(b.targets.i32()[2], -1);

  // Float inputs for an int32 model, and negative ids.
  spec.set_inputs(Write("f.npy", Npy("<f4", "(2, 3)", Bytes(Iota(6)))));
  spec.set_test_inputs(spec.inputs());
  const std::string floats = Error(spec, Shape{}, DType::kI32);
  EXPECT_THAT(floats, HasSubstr("inputs: " + spec.inputs()));
  EXPECT_THAT(floats, HasSubstr("must be integer ids"));
  EXPECT_THAT(floats, HasSubstr("got float32"));
  spec.set_inputs(Write(
      "n.npy", Npy("<i8", "(2, 3)", Bytes<int64_t>({5, 6, 7, 8, -2, 9}))));
  EXPECT_THAT(Error(spec, Shape{}, DType::kI32),
              HasSubstr("id -2 at sample 1 (input ids are >= 0)"));
}

TEST_F(TensorFilesTest, BadTargetsAreRefusedNamingTheValue) {
  gpipe::v1::TensorFiles spec;
  spec.set_inputs(Write("x.npy", Npy("<f4", "(20, 1)", Bytes(Iota(20)))));
  std::vector<int64_t> ids(20, 0);
  ids[17] = -3;
  spec.set_targets(Write("y.npy", Npy("<i8", "(20,)", Bytes(ids))));
  EXPECT_THAT(Error(spec),
              HasSubstr("targets: " + spec.targets() +
                        ": id -3 at sample 17 (ids are >= 0, or -1 for none)"));

  ids[17] = 3000000000LL;
  spec.set_targets(Write("big.npy", Npy("<i8", "(20,)", Bytes(ids))));
  const std::string big = Error(spec);
  EXPECT_THAT(big, HasSubstr("targets: " + spec.targets()));
  EXPECT_THAT(big, HasSubstr("3000000000 at sample 17 does not fit int32"));

  spec.set_targets(Write("f.npy", Npy("<f4", "(20,)", Bytes(Iota(20)))));
  EXPECT_THAT(Error(spec),
              HasSubstr("targets: " + spec.targets() +
                        ": must be integer class ids, got float32"));

  spec.set_targets(Write(
      "seq.npy", Npy("<i4", "(20, 2)", Bytes(std::vector<int32_t>(40, -9)))));
  EXPECT_THAT(Error(spec), HasSubstr("id -9 at sample 0, position 0"));

  spec.set_targets(
      Write("n.npy", Npy("<i4", "(19,)", Bytes(std::vector<int32_t>(19, 0)))));
  const std::string count = Error(spec);
  EXPECT_THAT(count, HasSubstr("targets: " + spec.targets()));
  EXPECT_THAT(count,
              HasSubstr("19 samples, but inputs " + spec.inputs() + " has 20"));

  spec.set_targets(Write(
      "r.npy", Npy("<i4", "(20, 1, 1)", Bytes(std::vector<int32_t>(20, 0)))));
  EXPECT_THAT(Error(spec), HasSubstr("targets are [N] or [N, T]"));
}

TEST_F(TensorFilesTest, BadInputsAreRefusedNamingTheFile) {
  gpipe::v1::TensorFiles spec;
  std::vector<float> x = Iota(20);
  x[7] = NAN;  // sample 3 of [10, 2]
  spec.set_inputs(Write("x.npy", Npy("<f4", "(10, 2)", Bytes(x))));
  spec.set_targets(
      Write("y.npy", Npy("|u1", "(10,)", Bytes(std::vector<uint8_t>(10)))));
  const std::string nan = Error(spec);
  EXPECT_THAT(nan, HasSubstr("inputs: " + spec.inputs()));
  EXPECT_THAT(nan, HasSubstr("nan is not finite"));
  EXPECT_THAT(nan, HasSubstr("(sample 3)"));

  spec.set_inputs(Write("t.npy", Npy("<f4", "(10, 2)", Bytes(Iota(10)))));
  EXPECT_THAT(Error(spec),
              HasSubstr("inputs: " + spec.inputs() +
                        ": truncated: the header promises 80 bytes of data, "
                        "the file has 40"));

  spec.set_inputs(Write("be.npy", Npy(">f4", "(10, 2)", Bytes(Iota(20)))));
  EXPECT_THAT(Error(spec), HasSubstr("big-endian"));

  spec.set_inputs(Write("ok.npy", Npy("<f4", "(10, 2)", Bytes(Iota(20)))));
  const std::string numel = Error(spec, Shape{1, 3});
  EXPECT_THAT(numel, HasSubstr("inputs: " + spec.inputs()));
  EXPECT_THAT(numel, HasSubstr("a sample has 2 elements ([2]), but the model "
                               "input [1, 3] holds 3"));

  spec.set_inputs(Write("x.csv", "1,2\n"));
  EXPECT_THAT(Error(spec), HasSubstr("inputs: " + spec.inputs() +
                                     ": not a .npy or .safetensors file"));

  // numpy's archive, with or without targets: named for what it is.
  spec.set_inputs(Write("data.npz", "PK\x03\x04"));
  EXPECT_THAT(Error(spec), HasSubstr("inputs: " + spec.inputs() +
                                     ": an .npz archive is not read"));
  spec.clear_targets();
  EXPECT_THAT(Error(spec), HasSubstr("an .npz archive is not read"));
  spec.set_targets(dir_.string() + "/y.npy");

  spec.set_inputs((dir_ / "missing.npy").string());
  auto missing = TensorFilesDataset::Open(spec, Shape{}, DType::kF32);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("inputs: "));
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.npy"));
}

TEST_F(TensorFilesTest, SplitsMustHoldSamples) {
  gpipe::v1::TensorFiles spec;
  spec.set_inputs(Write("x.npy", Npy("<f4", "(5, 1)", Bytes(Iota(5)))));
  spec.set_targets(
      Write("y.npy", Npy("|u1", "(5,)", Bytes(std::vector<uint8_t>(5)))));
  EXPECT_THAT(Error(spec), HasSubstr("5 samples are too few to split with "
                                     "test_fraction 0.1"));
  spec.set_test_fraction(1.5);
  EXPECT_THAT(
      Error(spec),
      HasSubstr("test_fraction: must be in [0, 1) (0 means the default 0.1)"));
  spec.set_test_fraction(0);
  spec.set_test_inputs(Write("tx.npy", Npy("<f4", "(0, 1)", "")));
  spec.set_test_targets(Write("ty.npy", Npy("|u1", "(0,)", "")));
  EXPECT_THAT(Error(spec),
              HasSubstr("test_inputs: " + spec.test_inputs() + ": no samples"));
  spec.clear_inputs();
  EXPECT_THAT(Error(spec), HasSubstr("inputs: required"));
}

}  // namespace
}  // namespace gpipe
