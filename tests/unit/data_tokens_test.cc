// Pre-tokenized data (data.tokens): uint16 and uint32 files, a header, a
// separate test file, windows and their targets, the largest id checked
// against the model, malformed files refused; and a small Transformer
// learns a token sequence from one.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/data/tokens.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

class TokensTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("tokens_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Little-endian ids of `bytes` bytes each after `header` zero bytes.
  std::string Write(const std::string& name, const std::vector<uint32_t>& ids,
                    int bytes = 2, int header = 0) {
    std::string out(header, '\0');
    for (uint32_t id : ids)
      for (int b = 0; b < bytes; ++b)
        out.push_back(static_cast<char>((id >> (8 * b)) & 0xff));
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << out;
    return path;
  }
  std::filesystem::path dir_;
};

std::vector<uint32_t> Iota(int n, uint32_t scale = 1) {
  std::vector<uint32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i) * scale;
  return v;
}

TEST_F(TokensTest, WindowsPredictTheNextId) {
  TokenFileOptions o;
  o.path = Write("train.bin", Iota(100));
  o.seq_len = 4;
  o.test_fraction = 0.2;  // 80 train ids, 20 test
  auto d = TokenDataset::Open(o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), (80 - 1) / 4);
  EXPECT_EQ((*d)->size(Split::kTest), (20 - 1) / 4);
  EXPECT_EQ((*d)->num_classes(), 100);
  const Batch b = (*d)->Gather(Split::kTrain, {0, 2});
  EXPECT_EQ(b.inputs.shape(), (Shape{2, 4}));
  EXPECT_EQ(b.inputs.i32()[0], 0);
  EXPECT_EQ(b.targets.i32()[0], 1);
  EXPECT_EQ(b.inputs.i32()[4], 8);  // the third window starts at id 8
  EXPECT_EQ(b.targets.i32()[7], 12);
  const Batch t = (*d)->Gather(Split::kTest, {1});
  EXPECT_EQ(t.inputs.i32()[0], 84);
  EXPECT_EQ(t.targets.i32()[3], 88);
}

TEST_F(TokensTest, Uint32AHeaderAndASeparateTestFile) {
  TokenFileOptions o;
  o.path = Write("train.bin", Iota(50, 100000), 4, 1024);
  o.test_path = Write("val.bin", Iota(20, 7), 4, 1024);
  o.bytes_per_id = 4;
  o.header_bytes = 1024;
  o.seq_len = 3;
  auto d = TokenDataset::Open(o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(Split::kTrain), 49 / 3);
  EXPECT_EQ((*d)->size(Split::kTest), 19 / 3);
  EXPECT_EQ((*d)->num_classes(), 49 * 100000 + 1);
  EXPECT_EQ((*d)->Gather(Split::kTrain, {1}).inputs.i32()[0], 300000);
  // Window 1 of the test file starts at its id 3; its last target is id 6.
  EXPECT_EQ((*d)->Gather(Split::kTest, {1}).targets.i32()[2], 6 * 7);
}

TEST_F(TokensTest, MalformedFilesAreRefusedNamingTheFile) {
  TokenFileOptions o;
  o.seq_len = 4;
  o.path = (dir_ / "missing.bin").string();
  EXPECT_TRUE(absl::IsNotFound(TokenDataset::Open(o).status()));

  o.path = Write("odd.bin", Iota(40));
  std::ofstream(o.path, std::ios::binary | std::ios::app) << 'x';
  auto odd = TokenDataset::Open(o);
  EXPECT_THAT(odd.status().message(),
              HasSubstr("not a whole number of uint16 ids"));
  EXPECT_THAT(odd.status().message(), HasSubstr("odd.bin"));

  o.path = Write("short.bin", Iota(6));
  EXPECT_THAT(TokenDataset::Open(o).status().message(),
              HasSubstr("fewer than seq_len + 1"));

  o.path = Write("empty.bin", {});
  EXPECT_FALSE(TokenDataset::Open(o).ok());

  o.path = Write("header.bin", Iota(40), 2, 16);
  o.header_bytes = 100;
  EXPECT_THAT(TokenDataset::Open(o).status().message(),
              HasSubstr("shorter than its header"));

  o.header_bytes = 0;
  o.bytes_per_id = 4;
  std::vector<uint32_t> huge = Iota(60);
  huge[17] = 0x80000000u;
  o.path = Write("huge.bin", huge, 4);
  EXPECT_THAT(TokenDataset::Open(o).status().message(),
              HasSubstr("does not fit an int32"));
}

std::string TokenSpec(const std::string& path, int vocab) {
  return absl::StrCat(R"({
    "model": {"input": {"dtype": "INT32", "shape": {"dims": [8]}},
      "layers": [
        {"embedding": {"vocabSize": )",
                      vocab, R"(, "dim": 32, "maxPositions": 8}},
        {"transformerBlock": {"dim": 32, "heads": 2}},
        {"layerNorm": {"features": 32}},
        {"linear": {"inFeatures": 32, "outFeatures": )",
                      vocab, R"(}}],
      "loss": {"softmaxCrossEntropy": {}}},
    "optimizer": {"lr": 0.01, "adamw": {}},
    "data": {"tokens": {"path": ")",
                      path, R"(", "seqLen": 8}},
    "pipeline": {"stages": 2, "microBatches": 2},
    "batchSize": 16, "steps": 150, "seed": 3})");
}

TEST_F(TokensTest, TheVocabularyMustHoldTheLargestId) {
  std::vector<uint32_t> ids;
  for (int i = 0; i < 400; ++i) ids.push_back((i * 7) % 13);
  const std::string path = Write("seq.bin", ids);
  auto small = ParseJobSpecJson(TokenSpec(path, 10));
  ASSERT_TRUE(small.ok()) << small.status();
  auto refused = OpenJobDataset(*small);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("model.layers[0].embedding.vocab_size: 10 is smaller "
                        "than the 13 tokens of data.tokens.path"));
  // The largest id in a test file of its own: both files are named (the
  // train file alone was, for an id it does not hold).
  std::vector<uint32_t> low;
  for (int i = 0; i < 400; ++i) low.push_back(i % 5);
  auto split = ParseJobSpecJson(TokenSpec(Write("low.bin", low), 10));
  ASSERT_TRUE(split.ok()) << split.status();
  split->mutable_data()->mutable_tokens()->set_test_path(path);
  refused = OpenJobDataset(*split);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("is smaller than the 13 tokens of data.tokens.path "));
  EXPECT_THAT(refused.status().message(),
              HasSubstr(" and data.tokens.test_path " + path));
}

TEST_F(TokensTest, ATransformerLearnsASequenceFromAFile) {
  // A sequence with period 13: once learnt, every next id is certain.
  std::vector<uint32_t> ids;
  for (int i = 0; i < 4000; ++i) ids.push_back((i * 7) % 13);
  auto spec = ParseJobSpecJson(TokenSpec(Write("seq.bin", ids), 13));
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto pipeline = InProcessPipeline::Create(*spec, OptionsFromSpec(*spec));
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  for (int s = 0; s < spec->steps(); ++s) ASSERT_TRUE((*pipeline)->Step().ok());
  auto eval = (*pipeline)->Evaluate(Split::kTest, 0);
  ASSERT_TRUE(eval.ok()) << eval.status();
  const double loss = eval->loss;
  std::printf("test loss after %lld steps: %.4f, accuracy %.4f\n",
              static_cast<long long>(spec->steps()), loss, eval->accuracy);
  EXPECT_LT(loss, 0.2);  // ln(13) = 2.56 at the start
}

}  // namespace
}  // namespace gpipe
