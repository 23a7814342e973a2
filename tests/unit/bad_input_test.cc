// The bad-input suite for the parsers: job specs that ask for absurd sizes or
// are hostile JSON, every prefix of a valid safetensors file and of a valid
// checkpoint manifest, and safetensors headers that declare huge sizes. Each
// gets a clear error of the right code naming what is wrong; none crashes,
// and none allocates what it declares (peak RSS is checked).
#include <sys/resource.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors.h"
#include "services/tensor/tensor.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

// Peak resident memory of this process so far, in bytes.
int64_t PeakRssBytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

constexpr int64_t kAllowedGrowth = int64_t{256} << 20;

// ---- Job specs --------------------------------------------------------------

// A small valid spec; `layers`, `batch` and `extra` are spliced in.
std::string Spec(const std::string& layers, const std::string& batch = "32",
                 const std::string& extra = "",
                 const std::string& dims = "[8]") {
  return absl::StrCat(R"({"model": {"input": {"dtype": "FLOAT32", "shape":
      {"dims": )",
                      dims, R"(}}, "layers": [)", layers,
                      R"(], "loss": {"softmax_cross_entropy": {}}},
    "optimizer": {"lr": 0.1, "sgd": {}},
    "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                           "train_samples": 64}},
    "batch_size": )",
                      batch, R"(, "steps": 5)", extra, "}");
}

const std::string kLayers =
    R"({"linear": {"in_features": 8, "out_features": 3}})";

struct HostileSpec {
  std::string name;
  std::string json;
  std::string error;  // a substring of the message
};

std::vector<HostileSpec> HostileSpecs() {
  const std::string deep(100000, '[');
  return {
      {"LayerOfABillionUnits",
       Spec(R"({"linear": {"in_features": 8, "out_features": 1000000000}},
               {"linear": {"in_features": 1000000000, "out_features": 3}})"),
       "model.layers[0].linear: its output [1000000000] has 1000000000 values "
       "per sample"},
      {"BatchOfATrillion", Spec(kLayers, "1000000000000"),
       "batch_size: 1000000000000 is too large (at most 16777216)"},
      {"EvalBatchOfATrillion",
       Spec(kLayers, "32", R"(, "eval": {"batch_size": 1000000000000})"),
       "eval.batch_size: 1000000000000 is too large"},
      {"WideLayerTimesBatch",
       Spec(R"({"linear": {"in_features": 8, "out_features": 100000000}},
               {"linear": {"in_features": 100000000, "out_features": 3}})",
            "1000"),
       "model.layers[0].linear: its output [100000000] times the batch of "
       "1000"},
      {"ModelOfTooManyParameters",
       Spec(R"({"linear": {"in_features": 8, "out_features": 100000}},
               {"linear": {"in_features": 100000, "out_features": 100000}},
               {"linear": {"in_features": 100000, "out_features": 3}})",
            "1"),
       "model.layers[1].linear: has 10000100000 parameters, more than "
       "4294967296 (a layer is held whole by one worker)"},
      // 310 layers of 3.6e9 parameters each: each fits a worker, the
      // model is past any pipeline.
      {"ModelOfTooManyParametersInAll",
       Spec(
           absl::StrCat(
               R"({"linear": {"in_features": 8, "out_features": 60000}})",
               absl::StrJoin(
                   std::vector<std::string>(
                       310,
                       R"(, {"linear": {"in_features": 60000, "out_features": 60000}})"),
                   "")),
           "1"),
       "brings the model to more than 1099511627776 parameters"},
      {"HugeInputDims",
       Spec(R"({"flatten": {}},
               {"linear": {"in_features": 8, "out_features": 3}})",
            "32", "", "[2147483647, 2147483647, 2147483647]"),
       "model.input"},
      {"NegativeBatch", Spec(kLayers, "-1"), "batch_size: must be positive"},
      {"ZeroBatch", Spec(kLayers, "0"), "batch_size: must be positive"},
      {"BatchOverflowsInt64", Spec(kLayers, "99999999999999999999"),
       "batch_size"},
      {"BatchNotANumber", Spec(kLayers, "\"32x\""), "batch_size"},
      {"BatchFraction", Spec(kLayers, "3.5"), "batch_size"},
      {"BatchInfinite", Spec(kLayers, "1e400"), "batch_size"},
      {"SeedAsObject", Spec(kLayers, "32", R"(, "seed": {"a": 1})"), "seed"},
      {"UnknownTopLevelField", Spec(kLayers, "32", R"(, "gpus": 8)"), "gpus"},
      {"UnknownLayerKind", Spec(R"({"quantum": {}})"), "quantum"},
      {"LayerWithTwoKinds",
       Spec(R"({"relu": {}, "linear": {"in_features": 8, "out_features": 3}})"),
       "job spec:"},
      {"NegativeUnits",
       Spec(R"({"linear": {"in_features": 8, "out_features": -3}})"),
       "model.layers[0].linear.out_features: must be positive"},
      {"NoLayers", Spec(""), "model.layers"},
      {"DeeplyNestedJson", absl::StrCat(R"({"name": )", deep), "job spec:"},
      {"NotAnObject", "[1, 2, 3]", "job spec:"},
      {"Empty", "", "job spec:"},
      {"BinaryGarbage", std::string("\x00\xff\xfe{\"\x80", 6), "job spec:"},
      {"NaNLearningRate",
       absl::StrCat(Spec(kLayers).substr(0, Spec(kLayers).find("\"lr\": 0.1")),
                    R"("lr": "NaN", "sgd": {}},
    "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                           "train_samples": 64}},
    "batch_size": 32, "steps": 5})"),
       "optimizer.lr"},
      {"NegativeCheckpointKeep",
       Spec(kLayers, "32", R"(, "checkpoint": {"every": 1, "keep": -1})"),
       "checkpoint.keep: must be >= 0"},
      {"NegativeMaxSamples",
       Spec(kLayers, "32", R"(, "eval": {"max_samples": -1})"),
       "eval.max_samples: must be >= 0"},
      {"MicroBatchesAboveBatch",
       Spec(kLayers, "4", R"(, "pipeline": {"micro_batches": 1000000000000})"),
       "pipeline.micro_batches"},
      {"StagesAboveLayers",
       Spec(kLayers, "32", R"(, "pipeline": {"stages": 1000000})"),
       "pipeline.stages"},
      {"SyntheticDataOfTwoToTheForty",
       absl::StrCat(
           Spec(kLayers).substr(0,
                                Spec(kLayers).find(R"("train_samples": 64)")),
           R"("train_samples": 1099511627776}}, "batch_size": 32, "steps": 5})"),
       "data.synthetic.train_samples: 1099511627776 samples of 9 values each "
       "are too many (at most 1073741824 values)"},
      // Limits on what the controller keeps.
      {"AMillionLayers",
       Spec(absl::StrCat(kLayers, ",",
                         [] {
                           std::string relus;
                           for (int i = 0; i < 20000; ++i) {
                             relus += R"({"relu": {}},)";
                           }
                           relus.pop_back();
                           return relus;
                         }())),
       "model.layers: 20001 layers are too many (at most 10000)"},
      {"ASpecOfMoreThanAMegabyte",
       Spec(kLayers, "32",
            absl::StrCat(R"(, "name": ")", std::string(2 << 20, 'x'), "\"")),
       "bytes is too large (at most 1048576)"},
      {"ANameWithANewline", Spec(kLayers, "32", R"(, "name": "a\nb")"),
       "name: holds a control character (byte 10)"},
      {"ANameWithAnAnsiEscape",
       Spec(kLayers, "32", R"(, "name": "\u001b[31mred")"),
       "name: holds a control character (byte 27)"},
      {"ANameThatTurnsTheLineAround",
       Spec(kLayers, "32", R"(, "name": "job\u202eevil")"),
       "name: holds the direction control U+202E"},
      {"ANameWithAC1Control", Spec(kLayers, "32", R"(, "name": "a\u009bb")"),
       "name: holds the control character U+009B"},
      {"MicroBatchesTimesStagesPastTheSchedulesLimit",
       Spec(absl::StrCat(R"({"relu": {}},)", kLayers), "16777216",
            R"(, "pipeline": {"stages": 2, "micro_batches": 16777216})"),
       "pipeline.micro_batches: 16777216 micro-batches over 2 stages are too "
       "many passes a step (at most 262144"},
      // A misspelt field is named with the field it was likely meant to be.
      {"AFieldSpeltInLowerCase", Spec(kLayers, "32", R"(, "batchsize": 3)"),
       "batchsize: Cannot find field (did you mean batchSize?)."},
      {"ANestedFieldALetterOff",
       Spec(R"({"linear": {"in_featurs": 8, "out_features": 3}})"),
       "(model.layers[0].linear) in_featurs: Cannot find field (did you mean "
       "inFeatures?)."},
      {"AFieldLikeNoOther", Spec(kLayers, "32", R"(, "zzz": 3)"),
       "zzz: Cannot find field."},
      {"ANameThatIsAPath", Spec(kLayers, "32", R"(, "name": "../../etc")"),
       "name: holds a path separator ('/')"},
      {"ALongName",
       Spec(kLayers, "32",
            absl::StrCat(R"(, "name": ")", std::string(300, 'n'), "\"")),
       "name: 300 bytes is too long (at most 256)"},
      {"StepsOfTwoToTheSixtyTwo",
       absl::StrCat(Spec(kLayers).substr(0, Spec(kLayers).rfind("\"steps\"")),
                    R"("steps": "4611686018427387904"})"),
       "steps: 4611686018427387904 is too many (at most 1000000000)"},
      {"KeepTwoToTheSixtyTwo",
       Spec(kLayers, "32",
            R"(, "checkpoint": {"every": 1, "keep": "4611686018427387904"})"),
       "checkpoint.keep: 4611686018427387904 is too many"},
      {"MaxRestartsTwoToTheSixtyTwo",
       Spec(kLayers, "32", R"(, "max_restarts": "4611686018427387904")"),
       "max_restarts: 4611686018427387904 is too many"},
      {"NegativeElasticGrace",
       Spec(kLayers, "32", R"(, "pipeline": {"elastic_grace_ms": -5})"),
       "pipeline.elastic_grace_ms: must be in [0, 86400000]"},
      // protobuf named the enum's type, not the names it takes.
      {"UnknownScheduleName",
       Spec(kLayers, "32", R"(, "pipeline": {"schedule": "zb-h1"})"),
       "(pipeline.schedule): invalid value \"zb-h1\" (one of GPIPE, "
       "ONE_F_ONE_B, "},
  };
}

void PrintTo(const HostileSpec& c, std::ostream* os) { *os << c.name; }

class HostileSpecTest : public ::testing::TestWithParam<HostileSpec> {};

TEST_P(HostileSpecTest, IsInvalidArgumentNamingTheField) {
  const HostileSpec& c = GetParam();
  const int64_t before = PeakRssBytes();
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(c.json);
  ASSERT_FALSE(spec.ok()) << "accepted: " << c.json.substr(0, 400);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument)
      << spec.status();
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.error));
  EXPECT_LT(PeakRssBytes() - before, kAllowedGrowth);
}

INSTANTIATE_TEST_SUITE_P(Table, HostileSpecTest,
                         ::testing::ValuesIn(HostileSpecs()),
                         [](const auto& info) { return info.param.name; });

TEST(HostileSpecTest, TheBaselineIsValid) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(Spec(kLayers));
  EXPECT_TRUE(spec.ok()) << spec.status();
  // With the byte-order mark Windows editors write before UTF-8 too.
  spec = ParseJobSpecJson(absl::StrCat("\xEF\xBB\xBF", Spec(kLayers)));
  EXPECT_TRUE(spec.ok()) << spec.status();
  // Names people write are fine, escaping characters included.
  EXPECT_TRUE(
      ParseJobSpecJson(Spec(kLayers, "32", R"(, "name": "trace-test <&\" é")"))
          .ok());
  // A batch at the limit is still valid.
  spec = ParseJobSpecJson(Spec(kLayers, absl::StrCat(kMaxBatchSize)));
  EXPECT_TRUE(spec.ok()) << spec.status();
}

// ---- Safetensors ---------------------------------------------------------

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat(
               "bad_input_test-", getpid(), "-",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(std::string_view name) const {
    return (dir_ / std::string(name)).string();
  }
  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static void WriteAll(const std::string& path, std::string_view bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::filesystem::path dir_;
};

std::string LengthPrefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out;
}

std::string WithHeader(const std::string& json, const std::string& data = "") {
  return absl::StrCat(LengthPrefix(json.size()), json, data);
}

TEST_F(FileTest, EveryPrefixOfAValidSafetensorsFileIsDataLoss) {
  const Tensor a = Tensor::FromVector({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = Tensor::FromInts({3}, {7, 8, 9});
  const std::string path = Path("valid.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(path, {{"a", &a}, {"b", &b}}, {{"step", "3"}}).ok());
  const std::string valid = ReadAll(path);
  ASSERT_TRUE(ParseSafetensors(valid, "valid").ok());
  const std::string cut = Path("cut.safetensors");
  for (size_t n = 0; n < valid.size(); ++n) {
    const std::string_view prefix(valid.data(), n);
    absl::StatusOr<SafetensorsFile> parsed = ParseSafetensors(prefix, "cut");
    ASSERT_FALSE(parsed.ok()) << "a prefix of " << n << " bytes parsed";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss)
        << n << ": " << parsed.status();
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("cut"));
    WriteAll(cut, prefix);
    absl::StatusOr<SafetensorsFile> read = ReadSafetensors(cut);
    ASSERT_FALSE(read.ok()) << "a file of " << n << " bytes read";
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss)
        << n << ": " << read.status();
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(cut));
  }
}

TEST_F(FileTest, HugeDeclaredSizesFailWithoutAllocating) {
  const int64_t before = PeakRssBytes();
  const std::vector<std::string> hostile = {
      // A header length of 2^63 and of 2^64 - 1.
      absl::StrCat(LengthPrefix(uint64_t{1} << 63), "{}"),
      absl::StrCat(LengthPrefix(~uint64_t{0}), "{}"),
      // A header length just past the file.
      absl::StrCat(LengthPrefix(1000), "{}"),
      // Shapes whose products overflow int64, with tiny offsets.
      WithHeader(
          R"({"t": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}})",
          "abcd"),
      WithHeader(
          R"({"t": {"dtype": "F32", "shape": [9223372036854775807, 2], "data_offsets": [0, 8]}})",
          "abcdefgh"),
      // A tensor of 4 TB that the file does not hold.
      WithHeader(
          R"({"t": {"dtype": "F32", "shape": [1099511627776], "data_offsets": [0, 4398046511104]}})",
          "abcd"),
      // Offsets past 2^64 and negative.
      WithHeader(
          R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 18446744073709551620]}})",
          "abcd"),
      WithHeader(
          R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})",
          "abcd"),
      WithHeader(
          R"({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
          "abcd"),
      // Deep nesting (a recursive parser would overflow its stack).
      WithHeader(std::string(200000, '[')),
      WithHeader(
          absl::StrCat(R"({"__metadata__": )", std::string(200000, '{'))),
      // The same tensor twice, and data that overlaps.
      WithHeader(
          R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
          "abcd"),
  };
  for (size_t i = 0; i < hostile.size(); ++i) {
    absl::StatusOr<SafetensorsFile> parsed =
        ParseSafetensors(hostile[i], absl::StrCat("hostile-", i));
    ASSERT_FALSE(parsed.ok()) << i;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss)
        << i << ": " << parsed.status();
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr(absl::StrCat("hostile-", i)));
    const std::string path = Path(absl::StrCat("hostile-", i));
    WriteAll(path, hostile[i]);
    absl::StatusOr<SafetensorsFile> read = ReadSafetensors(path);
    ASSERT_FALSE(read.ok()) << i;
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss)
        << i << ": " << read.status();
  }
  EXPECT_LT(PeakRssBytes() - before, kAllowedGrowth);
}

// ---- Checkpoint manifests -----------------------------------------------

TEST_F(FileTest, EveryPrefixOfAValidManifestIsDataLoss) {
  v1::CheckpointManifest m;
  m.set_job_id("job-1");
  m.set_step(20);
  m.set_epoch(3);
  for (int i = 0; i < 2; ++i) {
    v1::CheckpointFile* f = m.add_files();
    f->set_path(absl::StrCat("e3-stage-", i, ".safetensors"));
    f->set_sha256(std::string(64, 'a' + i));
    f->set_bytes(1000 + i);
    f->set_stage(i);
    f->set_layer_begin(2 * i);
    f->set_layer_end(2 * i + 2);
  }
  const std::string path = Path("MANIFEST.json");
  ASSERT_TRUE(storage::WriteManifest(path, m).ok());
  const std::string valid = ReadAll(path);
  ASSERT_TRUE(storage::ReadManifest(path).ok());
  const std::string cut = Path("cut.json");
  int rejected = 0;
  // Every cut before the closing brace (what follows it is whitespace).
  const size_t end = valid.rfind('}');
  for (size_t n = 0; n <= end; ++n) {
    WriteAll(cut, std::string_view(valid.data(), n));
    absl::StatusOr<v1::CheckpointManifest> read = storage::ReadManifest(cut);
    if (read.ok()) {
      ADD_FAILURE() << "a prefix of " << n << " bytes parsed";
      continue;
    }
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss)
        << n << ": " << read.status();
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(cut));
    ++rejected;
  }
  EXPECT_GT(rejected, 100);

  // Seeded mutations: a value or a DataLoss, never a crash; no file path
  // that escapes the checkpoint directory ever gets through.
  std::mt19937_64 rng(6);
  constexpr std::string_view kJsonBytes = "{}[]\",:.-/0123456789abcdef\\ \xff";
  for (int i = 0; i < 2000; ++i) {
    std::string bytes = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !bytes.empty(); ++e) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0:
          bytes[at] = kJsonBytes[rng() % kJsonBytes.size()];
          break;
        case 1:
          bytes.erase(at, 1 + rng() % 8);
          break;
        case 2:
          bytes.insert(at, 1, kJsonBytes[rng() % kJsonBytes.size()]);
          break;
      }
    }
    WriteAll(cut, bytes);
    absl::StatusOr<v1::CheckpointManifest> read = storage::ReadManifest(cut);
    if (!read.ok()) {
      EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss)
          << read.status();
      continue;
    }
    for (const v1::CheckpointFile& f : read->files()) {
      const std::filesystem::path p(f.path());
      EXPECT_FALSE(p.is_absolute()) << f.path();
      for (const auto& part : p) EXPECT_NE(part, "..") << f.path();
    }
  }
}

TEST_F(FileTest, HostileManifestsAreDataLoss) {
  const std::string path = Path("MANIFEST.json");
  const std::string file =
      R"("sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "bytes": 8, "layer_begin": 0, "layer_end": 2)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {absl::StrCat(R"({"step": 2, "files": [{"path": "../../etc/passwd", )",
                    file, "}]}"),
       "not a plain path"},
      {absl::StrCat(R"({"step": 2, "files": [{"path": "/etc/passwd", )", file,
                    "}]}"),
       "not a plain path"},
      {absl::StrCat(R"({"step": 2, "files": [{"path": "a/../../b", )", file,
                    "}]}"),
       "not a plain path"},
      {R"({"step": 2, "files": []})", "lists no files"},
      {absl::StrCat(R"({"step": -2, "files": [{"path": "a", )", file, "}]}"),
       "step is negative"},
      {R"({"step": 2, "files": [{"path": "a", "sha256": "xyz", "bytes": 8}]})",
       "sha256"},
      {absl::StrCat(R"({"step": 2, "files": [{"path": "a", )", file,
                    R"(, "bogus": 1}]})"),
       "not a checkpoint manifest"},
      {std::string(100000, '['), "not a checkpoint manifest"},
      {"", "not a checkpoint manifest"},
  };
  for (const auto& [json, error] : cases) {
    WriteAll(path, json);
    absl::StatusOr<v1::CheckpointManifest> read = storage::ReadManifest(path);
    ASSERT_FALSE(read.ok()) << json.substr(0, 200);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss)
        << read.status();
    EXPECT_THAT(std::string(read.status().message()), HasSubstr(error))
        << json.substr(0, 200);
  }
  // Larger than any manifest: refused before it is read.
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.seekp((int64_t{64} << 20) - 1);
    out.put('}');
  }
  const int64_t before = PeakRssBytes();
  absl::StatusOr<v1::CheckpointManifest> read = storage::ReadManifest(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("too large"));
  EXPECT_LT(PeakRssBytes() - before, int64_t{32} << 20);
}

}  // namespace
}  // namespace gpipe
