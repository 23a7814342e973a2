// What only the data says: a 0 vocab_size and head filled from a text file,
// its vocabulary recorded and then enforced, a CSV file's standardization
// written into data.normalize, paths made absolute and checked, and all of
// it carried into the model file's metadata.
#include "services/pipeline/data_resolution.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/data/dataset.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/model_file.h"
#include "services/storage/manifest.h"

namespace gpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

class DataResolutionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           ("data_resolution_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::filesystem::path dir_;
};

std::string CharModel(const std::string& path, int vocab, int head) {
  return absl::StrCat(R"({
    "model": {
      "input": {"dtype": "INT32", "shape": {"dims": [8]}},
      "layers": [
        {"embedding": {"vocab_size": )",
                      vocab, R"(, "dim": 16, "max_positions": 8}},
        {"transformer_block": {"dim": 16, "heads": 2}},
        {"linear": {"in_features": 16, "out_features": )",
                      head, R"(}}
      ],
      "loss": {"softmax_cross_entropy": {}}
    },
    "optimizer": {"lr": 0.01, "adamw": {}},
    "data": {"text": {"path": ")",
                      path, R"(", "seq_len": 8}},
    "batch_size": 4,
    "steps": 2
  })");
}

// 30 rows of two features and a class id in 0..2, header "a,b,y".
std::string ThreeClassCsv() {
  std::string csv = "a,b,y\n";
  for (int i = 0; i < 30; ++i)
    absl::StrAppend(&csv, i, ",", 2 * i, ",", i % 3, "\n");
  return csv;
}

// A linear classifier on such a table whose head the data sizes; `more`
// goes into the spec's data.csv, `rest` after data.
std::string CsvHeadSpec(const std::string& path, const std::string& more = "",
                        const std::string& rest = "") {
  return absl::StrCat(R"({
    "model": {
      "input": {"dtype": "FLOAT32", "shape": {"dims": [2]}},
      "layers": [{"linear": {"in_features": 2, "out_features": 0}}],
      "loss": {"softmax_cross_entropy": {}}
    },
    "optimizer": {"lr": 0.01, "sgd": {}},
    "data": {"csv": {"path": ")",
                      path, R"(", "target": "y")", more, R"(}},)", rest, R"(
    "batch_size": 4,
    "steps": 2
  })");
}

TEST_F(DataResolutionTest, AZeroVocabularyIsTheFilesAndIsRecorded) {
  const std::string path = Write("abc.txt", std::string(200, 'a') + "bcab\n");
  auto spec = ParseJobSpecJson(CharModel(path, 0, 0));
  ASSERT_TRUE(spec.ok()) << spec.status();
  // Four distinct bytes: '\n', 'a', 'b', 'c'.
  EXPECT_EQ(spec->model().layers(0).embedding().vocab_size(), 4);
  EXPECT_EQ(spec->model().layers(2).linear().out_features(), 4);
  EXPECT_EQ(spec->data().text().vocabulary(), "\nabc");
  EXPECT_TRUE(DataDependentFields(*spec).empty());

  const auto metadata = ModelFileMetadata(*spec, 2);
  EXPECT_EQ(metadata.at("gpipe.format_version"), "1");
  EXPECT_EQ(metadata.at("gpipe.vocabulary"), "[10, 97, 98, 99]");
  EXPECT_EQ(metadata.count("gpipe.preprocessing"), 0u);
  EXPECT_THAT(metadata.at("gpipe.job"), HasSubstr("\"vocabSize\":\"4\""));
}

// A checkpoint fetched with `fetch JOB --step N` has its job's spec beside
// its manifest (JOB.json): a job started from it reads its text with the
// trained vocabulary, not the new file's own (whose ids shifted under the
// trained embedding: a first loss of 5.79 where the model file gave 2.86). One
// an earlier gpipe wrote, without it, adopts nothing.
TEST_F(DataResolutionTest, AFetchedCheckpointsVocabularyIsAdopted) {
  const std::string trained_text =
      Write("trained.txt", std::string(200, 'a') + "zyx bc\n");
  auto trained = ParseJobSpecJson(CharModel(trained_text, 0, 0));
  ASSERT_TRUE(trained.ok()) << trained.status();
  ASSERT_EQ(trained->data().text().vocabulary(), "\n abcxyz");
  const auto checkpoint = [&](const std::string& name, bool with_spec) {
    const std::filesystem::path folder = dir_ / name;
    std::filesystem::create_directories(folder);
    v1::CheckpointManifest manifest;
    manifest.set_job_id("job-1");
    manifest.set_step(20);
    v1::CheckpointFile& file = *manifest.add_files();
    file.set_path("e1-stage-0.safetensors");
    file.set_sha256(std::string(64, '0'));
    file.set_layer_end(3);
    EXPECT_TRUE(storage::WriteManifest(
                    (folder / storage::kManifestName).string(), manifest)
                    .ok());
    if (with_spec) {
      std::string json;
      EXPECT_TRUE(
          google::protobuf::util::MessageToJsonString(*trained, &json).ok());
      std::ofstream(folder / storage::kJobSpecName) << json;
    }
    return folder.string();
  };
  const std::string recorded = checkpoint("step20", true);
  const std::string older = checkpoint("older", false);
  ASSERT_TRUE(RecordedJobSpec(recorded).ok());
  ASSERT_TRUE(RecordedJobSpec(recorded)->has_value());
  EXPECT_EQ((*RecordedJobSpec(recorded))->data().text().vocabulary(),
            "\n abcxyz");
  ASSERT_TRUE(RecordedJobSpec(older).ok());
  EXPECT_FALSE(RecordedJobSpec(older)->has_value());
  // A JOB.json that is there but not a spec is named, not read as none:
  // the job went on without the trained vocabulary.
  const std::string corrupt = checkpoint("corrupt", true);
  std::ofstream(std::filesystem::path(corrupt) / storage::kJobSpecName)
      << "garbage";
  EXPECT_THAT(RecordedJobSpec(corrupt).status().message(),
              HasSubstr(storage::kJobSpecName));

  // Fine-tuning text of fewer bytes: numbered afresh, 'a' would be id 1.
  const std::string tuning =
      Write("tuning.txt", std::string(200, 'b') + "abc a\n");
  for (const std::string& from : {recorded, older}) {
    auto spec = ParseJobSpecJson(CharModel(tuning, 7, 7), SpecCheck::kJsonOnly);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec->mutable_init_from()->set_path(from);
    ASSERT_TRUE(AdoptInitFromPreprocessing(&*spec).ok());
    EXPECT_EQ(spec->data().text().vocabulary(),
              from == recorded ? "\n abcxyz" : "")
        << from;
  }
  auto from_corrupt =
      ParseJobSpecJson(CharModel(tuning, 7, 7), SpecCheck::kJsonOnly);
  ASSERT_TRUE(from_corrupt.ok());
  from_corrupt->mutable_init_from()->set_path(corrupt);
  EXPECT_THAT(AdoptInitFromPreprocessing(&*from_corrupt).message(),
              HasSubstr("init_from.path: "));
}

// A size filled from the data that the model cannot take names where it
// came from: the spec said 0, the data's largest class id set it.
TEST_F(DataResolutionTest, AFilledSizeTooLargeNamesTheDataThatSetIt) {
  const std::string path =
      Write("big.csv", ThreeClassCsv() + "1,2,300000000\n");
  const std::string spec = CsvHeadSpec(path);
  auto parsed = ParseJobSpecJson(spec);
  ASSERT_FALSE(parsed.ok());
  // Past every value the data holds: a misread (a stray label, a token
  // file's dtype), refused before the layer's size is judged.
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("model.layers[0].linear.out_features: 0 would be "
                        "filled as 300000001 from the data's largest class "
                        "id 300000000, more than the 31 class ids the data "
                        "holds"));
  // Written by hand, the size is the user's: then the layer's own limit
  // judges it.
  std::string written = spec;
  written.replace(written.find("\"out_features\": 0"),
                  std::string("\"out_features\": 0").size(),
                  "\"out_features\": 300000001");
  EXPECT_THAT(ParseJobSpecJson(written).status().message(),
              Not(HasSubstr("would be filled")));
  // An error about another field carries no note: every error did, a
  // negative lr's too.
  const std::string ab = Write("ab.txt", std::string(200, 'a') + "b\n");
  std::string bad = CharModel(ab, 0, 0);
  const std::string lr = "\"lr\": 0.01";
  bad.replace(bad.find(lr), lr.size(), "\"lr\": -1.0");
  auto refused = ParseJobSpecJson(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("optimizer.lr"));
  EXPECT_THAT(refused.status().message(),
              Not(HasSubstr("was filled from the data")));
}

TEST_F(DataResolutionTest, ARecordedVocabularyIsEnforced) {
  const std::string path = Write("abc.txt", std::string(200, 'a') + "bcab\n");
  auto spec = ParseJobSpecJson(CharModel(path, 0, 0));
  ASSERT_TRUE(spec.ok()) << spec.status();
  // The same model on a file with a byte it has no id for.
  Write("abc.txt", std::string(200, 'a') + "bcaz\n");
  auto data = OpenJobDataset(*spec);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(),
              HasSubstr("data.text.path: " + path +
                        ": byte 122 ('z') at offset 203 is not in the "
                        "vocabulary of 4 bytes the job was given "
                        "(data.text.vocabulary, base64 in a spec's JSON"));
  // A vocabulary out of order is the spec's field's fault, not the file's.
  spec->mutable_data()->mutable_text()->set_vocabulary("ba");
  EXPECT_THAT(OpenJobDataset(*spec).status().message(),
              HasSubstr("data.text.vocabulary: must hold distinct bytes in "
                        "ascending order; byte 97 follows 98"));
}

TEST_F(DataResolutionTest, UnreadableDataLeavesARequiredFieldNamed) {
  auto spec = ParseJobSpecJson(CharModel((dir_ / "gone.txt").string(), 0, 5));
  ASSERT_FALSE(spec.ok());
  // The missing file first: giving the value alone led on to "cannot open".
  EXPECT_THAT(spec.status().message(),
              HasSubstr("data.text.path: " + (dir_ / "gone.txt").string() +
                        " does not exist here, and "
                        "model.layers[0].embedding.vocab_size is filled from "
                        "the data where the job is submitted: fix the path"));
  // A recorded-only field (the vocabulary) does not stop a submit.
  auto given = ParseJobSpecJson(CharModel((dir_ / "gone.txt").string(), 5, 5));
  EXPECT_TRUE(given.ok()) << given.status();
}

// The data is read for the model's input, so a bad input is named first:
// dims of -3 read as "the model input [-3] takes -3 values".
TEST_F(DataResolutionTest, ABadModelInputIsNamedBeforeTheDataIsRead) {
  const std::string csv = Write("t.csv", ThreeClassCsv());
  std::string spec = CsvHeadSpec(csv);
  spec.replace(spec.find("[2]"), 3, "[-3]");
  auto parsed = ParseJobSpecJson(spec);
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("model.input.shape.dims[0]: must be positive, got -3"));
}

// A job started from a model takes the model's preprocessing (its columns,
// normalization, vocabulary) before the data fills the rest: a missing init
// file stops both, and is named as what to fix. It read "init_from.path:
// ... does not exist here, and model.layers[0].linear.out_features is filled
// from the data", which blamed the data. Filling from the data alone would
// line the columns up with the new file's order, not the trained one's.
TEST_F(DataResolutionTest, AMissingInitFileIsNamedAsWhatStopsTheFilling) {
  const std::string path = Write("three.csv", ThreeClassCsv());
  const std::string gone = (dir_ / "gone.safetensors").string();
  const std::string json =
      CsvHeadSpec(path, R"(, "standardize": true)",
                  absl::StrCat(R"("init_from": {"path": ")", gone, R"("},)"));
  auto spec = ParseJobSpecJson(json);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(),
              HasSubstr("init_from.path: " + gone +
                        " does not exist here: a job started from a model "
                        "takes its inputs' preprocessing from that file"));
}

// A CSV's standardization where its file cannot be read names what to give
// instead: data.normalize's statistics (a boolean has no value to give).
TEST_F(DataResolutionTest, UnreadableStandardizationNamesNormalize) {
  const std::string gone = (dir_ / "gone.csv").string();
  auto spec = ParseJobSpecJson(absl::StrCat(R"({
    "model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [2]}},
              "layers": [{"linear": {"in_features": 2, "out_features": 2}}],
              "loss": {"softmax_cross_entropy": {}}},
    "optimizer": {"lr": 0.01, "sgd": {}},
    "data": {"csv": {"path": ")",
                                            gone, R"(", "target": "label",
                     "feature_columns": ["a", "b"], "standardize": true}},
    "batch_size": 4, "steps": 2})"));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(),
              HasSubstr("data.csv.standardize is filled from the data where "
                        "the job is submitted: fix the path, or, where only "
                        "the cluster's machines have the file, give "
                        "data.normalize (each feature's mean and std) in the "
                        "spec"));
}

TEST_F(DataResolutionTest, PathsResolveAgainstTheSubmitterAndAreChecked) {
  gpipe::v1::JobSpec spec;
  spec.mutable_data()->mutable_csv()->set_path("data/train.csv");
  spec.mutable_data()->mutable_csv()->set_test_path("/abs/test.csv");
  spec.mutable_init_from()->set_path("../weights");
  ResolveDataPaths("/home/me/project", &spec);
  EXPECT_EQ(spec.data().csv().path(), "/home/me/project/data/train.csv");
  EXPECT_EQ(spec.data().csv().test_path(), "/abs/test.csv");
  EXPECT_EQ(spec.init_from().path(), "/home/me/weights");
  const auto paths = SpecPaths(spec);
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[2].first, "init_from.path");
  const absl::Status missing = CheckSpecPathsExist(spec);
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(missing.message(),
            "data.csv.path: /home/me/project/data/train.csv does not exist");
}

TEST(ModelFileTest, NormalizationIsRecordedExactly) {
  gpipe::v1::JobSpec spec;
  spec.mutable_data()->mutable_normalize()->add_mean(0.286f);
  spec.mutable_data()->mutable_normalize()->add_std(0.353f);
  spec.mutable_data()->mutable_normalize()->add_mean(-1.5f);
  spec.mutable_data()->mutable_normalize()->add_std(1e-3f);
  const auto metadata = ModelFileMetadata(spec, 7);
  EXPECT_EQ(metadata.at("gpipe.preprocessing"),
            "{\"normalize\": {\"mean\": [0.286000013, -1.5], "
            "\"std\": [0.352999985, 0.00100000005]}}");
  EXPECT_EQ(metadata.at("gpipe.step"), "7");
}

}  // namespace
}  // namespace gpipe
