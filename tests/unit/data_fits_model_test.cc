// A text file whose vocabulary is larger than the model's embedding table
// or output classes is refused when the data is opened, naming the field,
// the value and the file (before this, its token ids reached the embedding
// kernel and corrupted the heap); and so is any dataset whose classes the
// model's outputs cannot hold.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/reference_trainer.h"
#include "tests/support/npy_file.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

class DataFitsModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             absl::StrCat("data_fits_model_test-", getpid(), ".txt"))
                .string();
    // 40 distinct bytes, repeated.
    std::string text;
    for (int i = 0; i < 400; ++i)
      text.push_back(static_cast<char>('0' + i % 40));
    std::ofstream(path_, std::ios::binary) << text;
  }
  void TearDown() override { std::filesystem::remove(path_); }

  gpipe::v1::JobSpec TextSpec(int64_t vocab, int64_t head) {
    absl::StatusOr<gpipe::v1::JobSpec> spec = ParseJobSpecJson(absl::StrCat(
        R"({"model": {"input": {"dtype": "INT32", "shape": {"dims": [8]}},
              "layers": [
                {"embedding": {"vocab_size": )",
        vocab, R"(, "dim": 8, "max_positions": 8}},
                {"linear": {"in_features": 8, "out_features": )",
        head, R"(}}],
              "loss": {"softmax_cross_entropy": {}}},
            "optimizer": {"lr": 0.01, "sgd": {}},
            "data": {"text": {"path": ")",
        path_, R"(", "seq_len": 8}},
            "batch_size": 4, "steps": 2})"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  std::string path_;
};

TEST_F(DataFitsModelTest, ASmallerEmbeddingThanTheVocabularyIsRefused) {
  const gpipe::v1::JobSpec spec = TextSpec(/*vocab=*/20, /*head=*/40);
  ASSERT_TRUE(ValidateJobSpec(spec).ok());  // only the file can tell
  absl::StatusOr<std::unique_ptr<Dataset>> data = OpenJobDataset(spec);
  ASSERT_TRUE(absl::IsInvalidArgument(data.status())) << data.status();
  EXPECT_THAT(data.status().message(),
              HasSubstr("model.layers[0].embedding.vocab_size: 20 is smaller "
                        "than the 40 tokens of data.text.path "));
  EXPECT_THAT(data.status().message(), HasSubstr(path_));
  // The trainer refuses to start the same way (before, a step corrupted
  // the heap).
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> trainer =
      ReferenceTrainer::Create(spec, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(trainer.status())) << trainer.status();
}

TEST_F(DataFitsModelTest, FewerOutputsThanClassesAreRefused) {
  absl::StatusOr<std::unique_ptr<Dataset>> data =
      OpenJobDataset(TextSpec(/*vocab=*/40, /*head=*/30));
  ASSERT_TRUE(absl::IsInvalidArgument(data.status())) << data.status();
  EXPECT_THAT(data.status().message(),
              HasSubstr("model.layers[1]: 30 outputs are fewer than the 40 "
                        "classes of data.text.path"));
}

TEST_F(DataFitsModelTest, AVocabularyThatFitsOpensAndTrains) {
  const gpipe::v1::JobSpec spec = TextSpec(/*vocab=*/40, /*head=*/40);
  absl::StatusOr<std::unique_ptr<Dataset>> data = OpenJobDataset(spec);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->num_classes(), 40);
  // Larger than needed is allowed.
  EXPECT_TRUE(OpenJobDataset(TextSpec(64, 50)).ok());
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> trainer =
      ReferenceTrainer::Create(spec, 1);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_TRUE((*trainer)->Step().ok());
}

// Token ids in tensor files (data.tensors) for an embedding: the job's
// dataset holds them as int32 ids. Before, OpenJobDataset read them as the
// default float32, and every worker refused ids such as 1088421888 (the
// bits of 7.0f) as outside the vocabulary.
TEST(DataTensorsForTokensTest, AnInt32ModelGetsTheIds) {
  const std::string path =
      (std::filesystem::temp_directory_path() /
       absl::StrCat("data_fits_model_test-", getpid(), "-ids.npy"))
          .string();
  // 40 sequences of 4 int64 ids in 0..16, as np.save writes them.
  std::vector<int64_t> ids(160);
  for (int i = 0; i < 160; ++i) ids[i] = (i * 7) % 17;
  std::ofstream(path, std::ios::binary) << test_support::NpyFile(
      "<i8", "(40, 4)",
      std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8));
  absl::StatusOr<gpipe::v1::JobSpec> spec = ParseJobSpecJson(absl::StrCat(
      R"({"model": {"input": {"dtype": "INT32", "shape": {"dims": [4]}},
            "layers": [
              {"embedding": {"vocab_size": 17, "dim": 8, "max_positions": 4}},
              {"linear": {"in_features": 8, "out_features": 17}}],
            "loss": {"softmax_cross_entropy": {}}},
          "optimizer": {"lr": 0.01, "sgd": {}},
          "data": {"tensors": {"inputs": ")",
      path, R"(", "targets": ")", path, R"("}},
          "batch_size": 4, "steps": 2})"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::unique_ptr<Dataset>> data = OpenJobDataset(*spec);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)->input_dtype(), DType::kI32);
  const Batch b = (*data)->Gather(Split::kTrain, {0});
  ASSERT_EQ(b.inputs.dtype(), DType::kI32);
  for (int i = 0; i < 4; ++i) EXPECT_LT(b.inputs.i32()[i], 17) << i;
  // And a trainer starts and steps on them.
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> trainer =
      ReferenceTrainer::Create(*spec, 1);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_TRUE((*trainer)->Step().ok());
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace gpipe
