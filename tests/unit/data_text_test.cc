// The character-level text dataset: vocabulary, splits, windows and errors.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/dataset.h"
#include "services/data/text.h"

namespace gpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class TextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("text_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  // The bytes a row of ids stands for.
  static std::string Decode(const TextDataset& d, const int32_t* ids,
                            int64_t n) {
    std::string s;
    for (int64_t i = 0; i < n; ++i) s.push_back(d.vocabulary()[ids[i]]);
    return s;
  }
  std::filesystem::path dir_;
};

TEST_F(TextTest, VocabularyIsSortedDistinctBytes) {
  const std::string path = Write("v.txt", "banana bread\n");
  auto d = TextDataset::Open(path, 2, 0.25);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_THAT((*d)->vocabulary(),
              ElementsAre('\n', ' ', 'a', 'b', 'd', 'e', 'n', 'r'));
  EXPECT_EQ((*d)->num_classes(), 8);
  EXPECT_EQ((*d)->TokenOf('a'), 2);
  EXPECT_EQ((*d)->TokenOf('z'), -1);
}

TEST_F(TextTest, SplitsAndWindows) {
  // 40 bytes; test_fraction 0.25 -> train is bytes [0, 30), test [30, 40).
  const std::string text = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";
  const std::string path = Write("w.txt", text);
  auto opened = TextDataset::Open(path, 4, 0.25);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const TextDataset& d = **opened;
  EXPECT_EQ(d.split_bytes(Split::kTrain), 30);
  EXPECT_EQ(d.split_bytes(Split::kTest), 10);
  EXPECT_EQ(d.size(Split::kTrain), (30 - 1) / 4);  // 7
  EXPECT_EQ(d.size(Split::kTest), (10 - 1) / 4);   // 2
  EXPECT_EQ(d.input_shape(), (Shape{4}));
  EXPECT_EQ(d.target_shape(), (Shape{4}));
  EXPECT_EQ(d.input_dtype(), DType::kI32);

  Batch b = d.Gather(Split::kTrain, {0, 6});
  EXPECT_EQ(b.inputs.shape(), (Shape{2, 4}));
  EXPECT_EQ(b.targets.shape(), (Shape{2, 4}));
  EXPECT_EQ(Decode(d, b.inputs.i32(), 4), "abcd");
  EXPECT_EQ(Decode(d, b.targets.i32(), 4), "bcde");
  // The last train window's targets end at the last train byte.
  EXPECT_EQ(Decode(d, b.inputs.i32() + 4, 4), "yz01");
  EXPECT_EQ(Decode(d, b.targets.i32() + 4, 4), "z012");

  Batch t = d.Gather(Split::kTest, {0, 1});
  EXPECT_EQ(Decode(d, t.inputs.i32(), 8),
            "4567"
            "89AB");
  EXPECT_EQ(Decode(d, t.targets.i32(), 8),
            "5678"
            "9ABC");
}

TEST_F(TextTest, DefaultTestFractionIsATenth) {
  const std::string path = Write("d.txt", std::string(1000, 'x') + "y");
  auto d = TextDataset::Open(path, 10);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->split_bytes(Split::kTest), 100);
  EXPECT_EQ((*d)->split_bytes(Split::kTrain), 901);
  EXPECT_EQ((*d)->size(Split::kTrain), 90);
  EXPECT_EQ((*d)->size(Split::kTest), 9);
}

TEST_F(TextTest, ExactlySeqLenPlusOneIsEnough) {
  // 12 bytes, half test: each split has 6 = seq_len + 1 bytes, one window.
  auto d = TextDataset::Open(Write("e.txt", "abcdefghijkl"), 5, 0.5);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), 1);
  EXPECT_EQ((*d)->size(Split::kTest), 1);
}

TEST_F(TextTest, EmptyFileIsInvalid) {
  const std::string path = Write("empty.txt", "");
  auto d = TextDataset::Open(path, 4);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr(path));
}

TEST_F(TextTest, ShortFileIsInvalid) {
  const std::string path = Write("short.txt", "abcdefghijkl");
  // The test split (1 byte at 0.1) is too short.
  auto d = TextDataset::Open(path, 4);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr(path));
  EXPECT_THAT(d.status().message(), HasSubstr("test split"));
  // The train split is too short.
  d = TextDataset::Open(path, 6, 0.5);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("train split"));
}

TEST_F(TextTest, OpenDatasetNamesTheField) {
  gpipe::v1::DataSpec spec;
  spec.mutable_text()->set_path("/x/y");
  spec.mutable_text()->set_seq_len(8);
  auto d = OpenDataset(spec, Shape(), 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(d.status().message(),
            "data.text.path: cannot open /x/y: No such file or directory");

  spec.mutable_text()->set_path(Write("s.txt", "abc"));
  d = OpenDataset(spec, Shape(), 0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("data.text.path: "));

  spec.mutable_text()->set_seq_len(0);
  d = OpenDataset(spec, Shape(), 0);
  EXPECT_THAT(d.status().message(), HasSubstr("data.text.seq_len:"));

  spec.mutable_text()->set_seq_len(2);
  spec.mutable_text()->set_test_fraction(1.5);
  d = OpenDataset(spec, Shape(), 0);
  EXPECT_THAT(d.status().message(), HasSubstr("data.text.test_fraction:"));

  // Windows longer than the model's input: the length is seq_len's.
  spec.mutable_text()->clear_test_fraction();
  spec.mutable_text()->set_path(Write("long.txt", std::string(400, 'a')));
  spec.mutable_text()->set_seq_len(32);
  d = OpenDataset(spec, Shape{16}, 0, DType::kI32);
  EXPECT_THAT(d.status().message(),
              HasSubstr("data.text.seq_len: a sample is [32]"));

  spec.mutable_text()->clear_path();
  d = OpenDataset(spec, Shape(), 0);
  EXPECT_THAT(d.status().message(), HasSubstr("data.text.path: required"));
}

// Not a file to read whole: /dev/zero was read until memory ran out, and a
// FIFO with no writer blocked for ever.
TEST_F(TextTest, OnlyARegularFileIsRead) {
  auto d = TextDataset::Open("/dev/zero", 4);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("/dev/zero: not a regular file"));
  const std::string fifo = Write("fifo", "");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  d = TextDataset::Open(fifo, 4);
  EXPECT_THAT(d.status().message(), HasSubstr(": not a regular file"));
  d = TextDataset::Open(std::filesystem::path(fifo).parent_path().string(), 4);
  EXPECT_THAT(d.status().message(), HasSubstr(": is a directory, not a file"));
}

TEST_F(TextTest, OpenDatasetReadsText) {
  gpipe::v1::DataSpec spec;
  spec.mutable_text()->set_path(Write("ok.txt", std::string(200, 'q') + "r"));
  spec.mutable_text()->set_seq_len(8);
  auto d = OpenDataset(spec, Shape{8}, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->num_classes(), 2);
  EXPECT_EQ((*d)->size(Split::kTest), (21 - 1) / 8);
}

}  // namespace
}  // namespace gpipe
