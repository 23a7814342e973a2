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
    absl::StatusOr<gpipe::v1::JobSpec> spec =
        ParseJobSpecJson(TextSpecJson(vocab, head));
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }
  std::string TextSpecJson(int64_t vocab, int64_t head) {
    return absl::StrCat(
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
            "batch_size": 4, "steps": 2})");
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

// Where the text is read (the submitter's machine), its vocabulary is
// resolved into the spec and checked against the model's scores there.
TEST_F(DataFitsModelTest, FewerOutputsThanClassesAreRefused) {
  absl::StatusOr<gpipe::v1::JobSpec> spec =
      ParseJobSpecJson(TextSpecJson(/*vocab=*/40, /*head=*/30));
  ASSERT_TRUE(absl::IsInvalidArgument(spec.status())) << spec.status();
  EXPECT_THAT(spec.status().message(),
              HasSubstr("data.text.vocabulary: 40 tokens (the text's "
                        "distinct bytes) are more than the 30 the model "
                        "scores"));
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

// Class-id targets for a classifier, from tensor files: one id a sample
// (or a column of them), each naming a class the model scores, and not all
// -1. Each was taken before: [N, 2] targets were read as twice the ids, a
// label out of range was blamed on the inputs file, and targets that were
// all -1 trained on nothing.
TEST(DataTensorsForClassesTest, TargetsMustBeOneIdASampleAndSomeClasses) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string x = absl::StrCat(dir, "/data_fits-", getpid(), "-x.npy");
  const std::string y = absl::StrCat(dir, "/data_fits-", getpid(), "-y.npy");
  std::vector<float> xs(40 * 4, 0.5f);
  std::ofstream(x, std::ios::binary) << test_support::NpyFile(
      "<f4", "(40, 4)",
      std::string(reinterpret_cast<const char*>(xs.data()), xs.size() * 4));
  const auto targets = [&](const std::string& shape,
                           const std::vector<int64_t>& ids) {
    std::ofstream(y, std::ios::binary | std::ios::trunc)
        << test_support::NpyFile(
               "<i8", shape,
               std::string(reinterpret_cast<const char*>(ids.data()),
                           ids.size() * 8));
    absl::StatusOr<gpipe::v1::JobSpec> spec = ParseJobSpecJson(absl::StrCat(
        R"({"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [4]}},
              "layers": [{"linear": {"in_features": 4, "out_features": 3}}],
              "loss": {"softmax_cross_entropy": {}}},
            "optimizer": {"lr": 0.01, "sgd": {}},
            "data": {"tensors": {"inputs": ")",
        x, R"(", "targets": ")", y, R"("}},
            "batch_size": 4, "steps": 2})"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    return OpenJobDataset(*spec).status();
  };
  std::vector<int64_t> ids(40);
  for (int i = 0; i < 40; ++i) ids[i] = i % 3;
  EXPECT_TRUE(targets("(40,)", ids).ok());
  EXPECT_TRUE(targets("(40, 1)", ids).ok());
  std::vector<int64_t> pairs(80, 1);
  EXPECT_THAT(targets("(40, 2)", pairs).message(),
              HasSubstr("data.tensors.targets " + y +
                        ": targets per sample are [2], but the model's output "
                        "[3] takes []"));
  ids[13] = 7;
  EXPECT_THAT(targets("(40,)", ids).message(),
              HasSubstr("3 outputs are fewer than the 8 classes of "
                        "data.tensors.targets " +
                        y));
  EXPECT_THAT(targets("(40,)", std::vector<int64_t>(40, -1)).message(),
              HasSubstr("every target of the train split is -1"));
  std::filesystem::remove(x);
  std::filesystem::remove(y);
}

// A class past the head that only the test split's file holds is named
// with that file (it was blamed on the training file, whose classes fit).
TEST(DataTensorsForClassesTest, AClassPastTheHeadIsNamedWithItsSplitsFile) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string base = absl::StrCat(dir, "/data_fits_split-", getpid());
  const auto npy = [](const std::string& path, const std::string& descr,
                      const std::string& shape, const void* data,
                      size_t bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << test_support::NpyFile(
               descr, shape,
               std::string(static_cast<const char*>(data), bytes));
  };
  std::vector<float> xs(20 * 4, 0.5f);
  std::vector<int64_t> train_ids(20), test_ids(20);
  for (int i = 0; i < 20; ++i) train_ids[i] = test_ids[i] = i % 3;
  test_ids[11] = 5;
  npy(base + "-x.npy", "<f4", "(20, 4)", xs.data(), xs.size() * 4);
  npy(base + "-tx.npy", "<f4", "(20, 4)", xs.data(), xs.size() * 4);
  npy(base + "-y.npy", "<i8", "(20,)", train_ids.data(), 20 * 8);
  npy(base + "-ty.npy", "<i8", "(20,)", test_ids.data(), 20 * 8);
  std::ofstream(base + "-train.csv", std::ios::trunc)
      << "a,b,c,d,label\n0,1,2,3,0\n1,2,3,4,1\n2,3,4,5,2\n";
  std::ofstream(base + "-test.csv", std::ios::trunc)
      << "a,b,c,d,label\n0,1,2,3,0\n1,2,3,4,5\n";
  const auto open = [](const std::string& data) {
    absl::StatusOr<gpipe::v1::JobSpec> spec = ParseJobSpecJson(absl::StrCat(
        R"({"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [4]}},
              "layers": [{"linear": {"in_features": 4, "out_features": 3}}],
              "loss": {"softmax_cross_entropy": {}}},
            "optimizer": {"lr": 0.01, "sgd": {}},
            "data": )",
        data, R"(, "batch_size": 2, "steps": 2})"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    return OpenJobDataset(*spec).status();
  };
  const std::string tensors = absl::StrCat(
      R"({"tensors": {"inputs": ")", base, R"(-x.npy", "targets": ")", base,
      R"(-y.npy", "test_inputs": ")", base, R"(-tx.npy", "test_targets": ")",
      base, R"(-ty.npy"}})");
  EXPECT_THAT(open(tensors).message(),
              HasSubstr("3 outputs are fewer than the 6 classes of "
                        "data.tensors.test_targets " +
                        base + "-ty.npy"));
  EXPECT_THAT(open(absl::StrCat(R"({"csv": {"path": ")", base,
                                R"(-train.csv", "test_path": ")", base,
                                R"(-test.csv", "target": "label"}})"))
                  .message(),
              HasSubstr("3 outputs are fewer than the 6 classes of "
                        "data.csv.test_path " +
                        base + "-test.csv (column label)"));
  // Where the training file holds one, it is the one named.
  npy(base + "-y.npy", "<i8", "(20,)", test_ids.data(), 20 * 8);
  EXPECT_THAT(open(tensors).message(),
              HasSubstr("classes of data.tensors.targets " + base + "-y.npy"));
  for (const char* suffix :
       {"-x.npy", "-tx.npy", "-y.npy", "-ty.npy", "-train.csv", "-test.csv"})
    std::filesystem::remove(base + suffix);
}

}  // namespace
}  // namespace gpipe
