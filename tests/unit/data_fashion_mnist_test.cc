// Fashion-MNIST: a tiny hand-written copy checks layout and normalization;
// the installed dataset (when present) checks sizes and labels.
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/dataset.h"
#include "services/data/fashion_mnist.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

void WriteIdxGz(const std::string& path, int rank,
                const std::vector<uint32_t>& dims,
                const std::vector<uint8_t>& values) {
  std::vector<uint8_t> b = {0, 0, 0x08, static_cast<uint8_t>(rank)};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(d >> shift);
  }
  b.insert(b.end(), values.begin(), values.end());
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, b.data(), b.size()), static_cast<int>(b.size()));
  gzclose(f);
}

class TinyFashionMnist : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::path(::testing::TempDir()) /
            ("fmnist_test_" + std::to_string(::getpid())))
               .string();
    std::filesystem::create_directories(dir_);
    // Image n has every pixel equal to n*50+k%7; label n%10.
    for (auto [prefix, n] : {std::pair{"train", 3}, std::pair{"t10k", 2}}) {
      std::vector<uint8_t> pixels(n * 784), labels(n);
      for (int i = 0; i < n; ++i) {
        for (int k = 0; k < 784; ++k) pixels[i * 784 + k] = i * 50 + k % 7;
        labels[i] = 9 - i;
      }
      WriteIdxGz(dir_ + "/" + prefix + "-images-idx3-ubyte.gz", 3,
                 {static_cast<uint32_t>(n), 28, 28}, pixels);
      WriteIdxGz(dir_ + "/" + prefix + "-labels-idx1-ubyte.gz", 1,
                 {static_cast<uint32_t>(n)}, labels);
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

// The dataset gives pixels in [0, 1]; the examples' data.normalize is
// applied on top (OpensWithAllSamples).
float Scaled(int v) { return v / 255.0f; }

TEST_F(TinyFashionMnist, LayoutAndScaling) {
  auto d = FashionMnist::Open(dir_, Shape{1, 28, 28});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), 3);
  EXPECT_EQ((*d)->size(Split::kTest), 2);
  EXPECT_EQ((*d)->num_classes(), 10);
  EXPECT_EQ((*d)->input_shape(), (Shape{1, 28, 28}));
  EXPECT_EQ((*d)->target_shape(), Shape());
  Batch b = (*d)->Gather(Split::kTrain, {2, 0});
  EXPECT_EQ(b.inputs.shape(), (Shape{2, 1, 28, 28}));
  EXPECT_EQ(b.inputs.dtype(), DType::kF32);
  EXPECT_EQ(b.targets.shape(), (Shape{2}));
  EXPECT_EQ(b.targets.dtype(), DType::kI32);
  EXPECT_EQ(b.targets.i32()[0], 7);
  EXPECT_EQ(b.targets.i32()[1], 9);
  for (int k = 0; k < 784; ++k) {
    ASSERT_FLOAT_EQ(b.inputs.f32()[k], Scaled(100 + k % 7));
    ASSERT_FLOAT_EQ(b.inputs.f32()[784 + k], Scaled(k % 7));
  }
  Batch t = (*d)->Gather(Split::kTest, {1});
  EXPECT_EQ(t.targets.i32()[0], 8);
  EXPECT_FLOAT_EQ(t.inputs.f32()[3], Scaled(53));
}

TEST_F(TinyFashionMnist, FlatLayoutForAnMlp) {
  auto d = FashionMnist::Open(dir_, Shape{784});
  ASSERT_TRUE(d.ok()) << d.status();
  Batch b = (*d)->Gather(Split::kTrain, {1});
  EXPECT_EQ(b.inputs.shape(), (Shape{1, 784}));
  EXPECT_FLOAT_EQ(b.inputs.f32()[5], Scaled(55));
}

TEST_F(TinyFashionMnist, WrongInputShapeIsRejected) {
  auto d = FashionMnist::Open(dir_, Shape{3, 32, 32});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  gpipe::v1::DataSpec spec;
  spec.mutable_fashion_mnist()->set_dir(dir_);
  auto o = OpenDataset(spec, Shape{10}, 0);
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.status().message(), HasSubstr("data.fashion_mnist"));
}

TEST_F(TinyFashionMnist, LabelOutOfRangeIsDataLoss) {
  WriteIdxGz(dir_ + "/t10k-labels-idx1-ubyte.gz", 1, {2}, {3, 10});
  auto d = FashionMnist::Open(dir_);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr("t10k-labels-idx1-ubyte.gz"));
}

TEST_F(TinyFashionMnist, CountMismatchIsDataLoss) {
  WriteIdxGz(dir_ + "/train-labels-idx1-ubyte.gz", 1, {2}, {3, 4});
  auto d = FashionMnist::Open(dir_);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(d.status().message(), HasSubstr("train-labels-idx1-ubyte.gz"));
}

TEST(FashionMnistOpen, MissingDirNamesFieldAndFile) {
  gpipe::v1::DataSpec spec;
  spec.mutable_fashion_mnist()->set_dir("/nonexistent/fmnist");
  auto d = OpenDataset(spec, Shape{1, 28, 28}, 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(d.status().message(),
              HasSubstr("data.fashion_mnist.dir: cannot open "
                        "/nonexistent/fmnist/train-images-idx3-ubyte.gz"));
}

TEST(FashionMnistReal, OpensWithAllSamples) {
  if (!std::filesystem::exists(FashionMnist::kDefaultDir)) {
    GTEST_SKIP() << FashionMnist::kDefaultDir << " not installed";
  }
  // The spec's empty dir means the default directory; the examples'
  // normalization (the training pixels' statistics).
  gpipe::v1::DataSpec spec;
  spec.mutable_fashion_mnist();
  spec.mutable_normalize()->add_mean(0.2860f);
  spec.mutable_normalize()->add_std(0.3530f);
  auto d = OpenDataset(spec, Shape{784}, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), 60000);
  EXPECT_EQ((*d)->size(Split::kTest), 10000);
  EXPECT_EQ((*d)->input_shape(), (Shape{784}));
  for (Split split : {Split::kTrain, Split::kTest}) {
    std::vector<int64_t> all((*d)->size(split));
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    Batch b = (*d)->Gather(split, all);
    std::vector<int64_t> counts(10);
    for (int64_t i = 0; i < b.targets.numel(); ++i) {
      const int32_t label = b.targets.i32()[i];
      ASSERT_GE(label, 0);
      ASSERT_LT(label, 10);
      ++counts[label];
    }
    // Fashion-MNIST is balanced: 6000 / 1000 of each class.
    for (int64_t c : counts) EXPECT_EQ(c, (*d)->size(split) / 10);
    if (split == Split::kTrain) {
      // Normalized by the spec with the training statistics: mean ~0,
      // std ~1.
      double sum = 0, sq = 0;
      const float* x = b.inputs.f32();
      for (int64_t i = 0; i < b.inputs.numel(); ++i) {
        sum += x[i];
        sq += double{x[i]} * x[i];
      }
      const double mean = sum / b.inputs.numel();
      const double var = sq / b.inputs.numel() - mean * mean;
      EXPECT_NEAR(mean, 0.0, 0.01);
      EXPECT_NEAR(std::sqrt(var), 1.0, 0.01);
    }
  }
}

}  // namespace
}  // namespace gpipe
