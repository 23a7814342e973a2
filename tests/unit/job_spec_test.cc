// Job spec parsing and validation: valid specs of each family pass, and each
// malformed spec fails with a message that names the offending field.
#include "services/pipeline/job_spec.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/data_resolution.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Layers: linear, relu, dropout, linear, tanh, linear.
constexpr std::string_view kMlp = R"({
  "name": "mlp",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [784]}},
    "layers": [
      {"linear": {"in_features": 784, "out_features": 256}},
      {"relu": {}},
      {"dropout": {"p": 0.1}},
      {"linear": {"in_features": 256, "out_features": 128}},
      {"tanh": {}},
      {"linear": {"in_features": 128, "out_features": 10}}
    ],
    "loss": {"softmax_cross_entropy": {}}
  },
  "optimizer": {"lr": 0.1, "sgd": {"momentum": 0.9}, "clip_norm": 1.0},
  "data": {"fashion_mnist": {}},
  "pipeline": {"stages": 2, "micro_batches": 4, "balance": [3, 3]},
  "batch_size": 32,
  "steps": 100,
  "checkpoint": {"every": 50, "keep": 2},
  "eval": {"every": 50},
  "max_restarts": 3
})";

// [1,28,28] -> conv [8,28,28] -> pool [8,14,14] -> conv/2 [16,7,7] -> [16].
constexpr std::string_view kCnn = R"({
  "name": "cnn",
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [1, 28, 28]}},
    "layers": [
      {"conv2d": {"in_channels": 1, "out_channels": 8, "kernel_size": 3, "padding": 1}},
      {"batch_norm": {"features": 8}},
      {"relu": {}},
      {"max_pool2d": {"kernel_size": 2}},
      {"conv2d": {"in_channels": 8, "out_channels": 16, "kernel_size": 3, "stride": 2, "padding": 1}},
      {"relu": {}},
      {"global_avg_pool": {}},
      {"linear": {"in_features": 16, "out_features": 10}}
    ],
    "loss": {"softmax_cross_entropy": {}}
  },
  "optimizer": {"lr": 0.001, "adamw": {"beta1": 0.9, "beta2": 0.95, "weight_decay": 0.05},
                "warmup_steps": 10, "decay": "LR_DECAY_COSINE"},
  "data": {"fashion_mnist": {"dir": "/tmp/fmnist"}},
  "pipeline": {"stages": 4, "micro_batches": 8, "schedule": "ONE_F_ONE_B",
               "remat": "ALWAYS", "min_stages": 2},
  "batch_size": 64,
  "steps": 200,
  "seed": 7
})";

// COPY over 10 symbols, 8 per half: [16] ids in, [16, 11] logits out.
constexpr std::string_view kCopy = R"({
  "model": {
    "input": {"dtype": "INT32", "shape": {"dims": [16]}},
    "layers": [
      {"embedding": {"vocab_size": 11, "dim": 32, "max_positions": 16}},
      {"transformer_block": {"dim": 32, "heads": 4, "dropout": 0.1}},
      {"transformer_block": {"dim": 32, "heads": 4, "mlp_hidden": 64}},
      {"self_attention": {"dim": 32, "heads": 2, "causal": true}},
      {"layer_norm": {"features": 32}},
      {"gelu": {}},
      {"linear": {"in_features": 32, "out_features": 11}}
    ],
    "loss": {"softmax_cross_entropy": {}}
  },
  "optimizer": {"lr": 0.0003, "adamw": {}},
  "data": {"synthetic": {"task": "COPY", "vocab_size": 10, "length": 8,
                         "train_samples": 2048, "test_samples": 256}},
  "pipeline": {"stages": 3, "micro_batches": 4, "balance": [2, 2, 3]},
  "batch_size": 16,
  "steps": 300
})";

constexpr std::string_view kText = R"({
  "model": {
    "input": {"dtype": "INT32", "shape": {"dims": [64]}},
    "layers": [
      {"embedding": {"vocab_size": 96, "dim": 32, "max_positions": 64}},
      {"transformer_block": {"dim": 32, "heads": 4}},
      {"linear": {"in_features": 32, "out_features": 96}}
    ],
    "loss": {"softmax_cross_entropy": {}}
  },
  "optimizer": {"lr": 0.001, "adamw": {}},
  "data": {"text": {"path": "corpus.txt", "seq_len": 64, "test_fraction": 0.1}},
  "batch_size": 8,
  "steps": 10
})";

constexpr std::string_view kClasses = R"({
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [16]}},
    "layers": [
      {"linear": {"in_features": 16, "out_features": 32}},
      {"batch_norm": {"features": 32, "momentum": 0.1}},
      {"gelu": {}},
      {"linear": {"in_features": 32, "out_features": 4}}
    ],
    "loss": {"softmax_cross_entropy": {}}
  },
  "optimizer": {"lr": 0.05, "sgd": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": 16, "classes": 4,
                         "train_samples": 512}},
  "batch_size": 32,
  "steps": 50
})";

constexpr std::string_view kMissing = "<<edit target not found>>";

// `base` with its single occurrence of `from` replaced by `to`. A `from` that
// is absent or ambiguous yields a marker the test rejects, so a table row
// cannot silently test the unmodified baseline.
std::string With(std::string_view base, std::string_view from,
                 std::string_view to) {
  const size_t at = base.find(from);
  if (at == std::string_view::npos ||
      base.find(from, at + 1) != std::string_view::npos) {
    return std::string(kMissing);
  }
  std::string out(base);
  out.replace(at, from.size(), to);
  return out;
}

TEST(JobSpecTest, BaselinesParse) {
  for (std::string_view json : {kMlp, kCnn, kCopy, kText, kClasses}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(json);
    EXPECT_TRUE(spec.ok()) << spec.status() << "\n" << json;
  }
}

TEST(JobSpecTest, ParsedFieldsAndDefaults) {
  absl::StatusOr<v1::JobSpec> cnn = ParseJobSpecJson(kCnn);
  ASSERT_TRUE(cnn.ok()) << cnn.status();
  EXPECT_EQ(cnn->name(), "cnn");
  EXPECT_EQ(cnn->pipeline().schedule(), v1::ONE_F_ONE_B);
  EXPECT_EQ(StageCount(*cnn), 4);
  EXPECT_EQ(MicroBatchCount(*cnn), 8);

  absl::StatusOr<v1::JobSpec> text = ParseJobSpecJson(kText);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(StageCount(*text), 1);  // no pipeline section: 0 means 1
  EXPECT_EQ(MicroBatchCount(*text), 1);
}

// protobuf's words, without its empty root path (": Root element") or a
// caret under no text.
TEST(JobSpecTest, JsonErrorsReadAsOneLine) {
  EXPECT_EQ(ParseJobSpecJson("[]").status().message(),
            "job spec: Root element must be a message.");
  EXPECT_EQ(ParseJobSpecJson("{\"model\": {").status().message(),
            "job spec: Unexpected end of string. Expected an object key or }.");
  EXPECT_EQ(ParseJobSpecJson("{\"model\": 3}").status().message(),
            "job spec: (model): invalid value 3 for type "
            "type.googleapis.com/gpipe.v1.ModelSpec");
}

TEST(JobSpecTest, LinearMismatchMessageIsExact) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(
      With(kMlp, R"("in_features": 256)", R"("in_features": 512)"));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(),
            "model.layers[3].linear.in_features: 512 does not match the "
            "previous layer's output 256");
}

struct BadSpec {
  std::string name;
  std::string json;
  std::string error;  // a substring of the message, field path included
  // Protobuf words its own parse errors differently across versions; for
  // those rows this is what any wording must mention (the field or value).
  std::string also = "";
};

void PrintTo(const BadSpec& c, std::ostream* os) { *os << c.name; }

class BadSpecTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(BadSpecTest, FailsNamingTheField) {
  const BadSpec& c = GetParam();
  ASSERT_EQ(c.json.find(kMissing), std::string::npos)
      << "table row edits text the baseline does not contain";
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(c.json);
  ASSERT_FALSE(spec.ok()) << "accepted:\n" << c.json;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.error));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.also));
}

std::vector<BadSpec> BadSpecs() {
  return {
      // Syntax and types: protobuf's own message behind our prefix.
      {"UnknownField",
       With(kMlp, R"("steps": 100,)", R"("steps": 100, "bogus": 1,)"),
       "job spec:", "bogus"},
      {"UnknownNestedField",
       With(kMlp, R"("in_features": 784,)", R"("in_feature": 784,)"),
       "job spec:", "in_feature"},
      {"WrongJsonType", With(kMlp, R"("steps": 100)", R"("steps": [100])"),
       "job spec:", "steps"},
      {"StringForNumber",
       With(kMlp, R"("batch_size": 32)", R"("batch_size": "lots")"),
       "job spec:", "batch_size"},
      {"InvalidJson", std::string(kMlp.substr(0, kMlp.size() / 2)),
       "job spec:"},
      {"UnknownEnumName",
       With(kCnn, R"("schedule": "ONE_F_ONE_B")", R"("schedule": "ZIGZAG")"),
       "job spec:", "ZIGZAG"},

      // The model.
      {"NegativeSize",
       With(kMlp, R"("out_features": 256)", R"("out_features": -5)"),
       "model.layers[0].linear.out_features: must be positive, got -5"},
      {"LinearMismatch",
       With(kMlp, R"("in_features": 256)", R"("in_features": 512)"),
       "model.layers[3].linear.in_features: 512 does not match the previous "
       "layer's output 256"},
      {"ConvChannelMismatch",
       With(kCnn, R"("in_channels": 8)", R"("in_channels": 4)"),
       "model.layers[4].conv2d.in_channels: 4 does not match the previous "
       "layer's output channels 8"},
      {"ConvKernelTooLarge",
       With(kCnn, R"("kernel_size": 3, "padding": 1)",
            R"("kernel_size": 31, "padding": 1)"),
       "model.layers[0].conv2d.kernel_size: 31 is larger than the padded "
       "input"},
      {"ConvNegativePadding",
       With(kCnn, R"("kernel_size": 3, "padding": 1)",
            R"("kernel_size": 3, "padding": -1)"),
       "model.layers[0].conv2d.padding: must be >= 0, got -1"},
      {"PoolKernelTooLarge",
       With(kCnn, R"("max_pool2d": {"kernel_size": 2})",
            R"("max_pool2d": {"kernel_size": 29})"),
       "model.layers[3].max_pool2d.kernel_size: 29 is larger than the input"},
      {"BatchNormMismatch", With(kCnn, R"("features": 8)", R"("features": 3)"),
       "model.layers[1].batch_norm.features: 3 does not match"},
      {"BatchNormMomentum",
       With(kClasses, R"("momentum": 0.1)", R"("momentum": 2)"),
       "model.layers[1].batch_norm.momentum: must be in [0, 1]"},
      // One sample a micro-batch normalizes to 0 on [F] features; a 1x1
      // position per channel too.
      {"BatchNormOfOneSample",
       With(kClasses, R"("batch_size": 32)",
            R"("batch_size": 3, "pipeline": {"micro_batches": 2})"),
       "model.layers[1].batch_norm: normalizes each micro-batch over its "
       "samples: batch_size 3 in 2 micro-batches leaves micro-batches of 1 "
       "sample"},
      {"EmbeddingOnFloatInput",
       With(kCopy, R"("dtype": "INT32")", R"("dtype": "FLOAT32")"),
       "model.layers[0].embedding: needs int32 token ids as input, got "
       "float32"},
      {"IntInputIntoLinear",
       With(kMlp, R"("dtype": "FLOAT32")", R"("dtype": "INT32")"),
       "model.layers[0].linear: needs a float32 input, got int32"},
      {"EmbeddingTooFewPositions",
       With(kCopy, R"("max_positions": 16)", R"("max_positions": 8)"),
       "model.layers[0].embedding.max_positions: 8 is smaller than the "
       "sequence length 16"},
      {"HeadsDoNotDivideDim",
       With(kCopy, R"("heads": 4, "dropout": 0.1)",
            R"("heads": 5, "dropout": 0.1)"),
       "model.layers[1].transformer_block.heads: dim 32 is not divisible by 5 "
       "heads"},
      {"AttentionDimMismatch",
       With(kCopy, R"("self_attention": {"dim": 32)",
            R"("self_attention": {"dim": 64)"),
       "model.layers[3].self_attention.dim: 64 does not match"},
      {"NegativeMlpHidden",
       With(kCopy, R"("mlp_hidden": 64)", R"("mlp_hidden": -1)"),
       "model.layers[2].transformer_block.mlp_hidden: must be >= 0"},
      {"LayerNormUnset",
       With(kCopy, R"("layer_norm": {"features": 32})", R"("layer_norm": {})"),
       "model.layers[4].layer_norm.features: 0 does not match"},
      {"DropoutOne", With(kMlp, R"("p": 0.1)", R"("p": 1)"),
       "model.layers[2].dropout.p: must be in [0, 1), got 1"},
      {"NoLayerKind", With(kMlp, R"({"relu": {}})", "{}"),
       "model.layers[1]: no layer kind set"},
      {"NoLayers",
       R"({"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [4]}},
                     "layers": [], "loss": {"softmax_cross_entropy": {}}},
           "optimizer": {"lr": 0.1, "sgd": {}}, "data": {"fashion_mnist": {}},
           "batch_size": 1, "steps": 1})",
       "model.layers: needs at least one layer"},
      {"MissingLoss",
       With(kMlp, R"("loss": {"softmax_cross_entropy": {}})", R"("loss": {})"),
       "model.loss: no loss set"},
      {"LossOnImageOutput",
       R"({"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [1, 8, 8]}},
                     "layers": [{"conv2d": {"in_channels": 1, "out_channels": 2,
                                            "kernel_size": 3}}],
                     "loss": {"softmax_cross_entropy": {}}},
           "optimizer": {"lr": 0.1, "sgd": {}}, "data": {"fashion_mnist": {}},
           "batch_size": 1, "steps": 1})",
       "model.loss: softmax_cross_entropy needs a final output of [C] classes "
       "or [T, V] per token, got [2, 6, 6]"},
      {"MissingInputDtype", With(kMlp, R"("dtype": "FLOAT32", )", ""),
       "model.input.dtype: must be FLOAT32 or INT32"},
      {"ZeroInputDim",
       With(kCnn, R"("dims": [1, 28, 28])", R"("dims": [0, 28, 28])"),
       "model.input.shape.dims[0]: must be positive, got 0"},
      {"NoInputDims", With(kMlp, R"("dims": [784])", R"("dims": [])"),
       "model.input.shape.dims: needs at least one dimension"},

      // Training loop and optimizer.
      {"ZeroSteps", With(kMlp, R"("steps": 100)", R"("steps": 0)"),
       "steps: must be positive, got 0"},
      {"NegativeBatch",
       With(kMlp, R"("batch_size": 32)", R"("batch_size": -1)"),
       "batch_size: must be positive, got -1"},
      {"ZeroLr", With(kMlp, R"("lr": 0.1)", R"("lr": 0)"),
       "optimizer.lr: must be positive and finite, got 0"},
      {"InfiniteLr", With(kMlp, R"("lr": 0.1)", R"("lr": "Infinity")"),
       "optimizer.lr: must be positive and finite"},
      {"MissingOptimizerKind", With(kMlp, R"("sgd": {"momentum": 0.9}, )", ""),
       "optimizer: no optimizer set (expected sgd or adamw)"},
      {"SgdMomentumOne", With(kMlp, R"("momentum": 0.9)", R"("momentum": 1)"),
       "optimizer.sgd.momentum: must be in [0, 1), got 1"},
      {"AdamBeta2One", With(kCnn, R"("beta2": 0.95)", R"("beta2": 1.0)"),
       "optimizer.adamw.beta2: must be in [0, 1), got 1"},
      {"AdamNegativeDecay",
       With(kCnn, R"("weight_decay": 0.05)", R"("weight_decay": -0.05)"),
       "optimizer.adamw.weight_decay: must be >= 0"},
      {"NegativeClipNorm",
       With(kMlp, R"("clip_norm": 1.0)", R"("clip_norm": -1.0)"),
       "optimizer.clip_norm: must be >= 0"},
      {"UnknownWeightDecayOn",
       With(kCnn, R"("warmup_steps": 10)",
            R"("warmup_steps": 10, "weight_decay_on": 7)"),
       "optimizer.weight_decay_on: unknown value 7"},
      {"NegativeWarmup",
       With(kCnn, R"("warmup_steps": 10)", R"("warmup_steps": -10)"),
       "optimizer.warmup_steps: must be >= 0, got -10"},

      // Data against the model.
      {"NoDataSource", With(kMlp, R"("data": {"fashion_mnist": {}},)", ""),
       "data: no data source set"},
      {"FashionMnistWrongClasses",
       With(kCnn, R"("out_features": 10)", R"("out_features": 5)"),
       "data.fashion_mnist: needs a model output of [10] classes, got [5]"},
      {"FashionMnistWrongInput",
       With(kMlp, R"("dims": [784])", R"("dims": [1, 784])"),
       "data.fashion_mnist: needs a model input of FLOAT32 [1, 28, 28] or "
       "[784], got FLOAT32 [1, 784]"},
      {"SyntheticTaskUnset", With(kCopy, R"("task": "COPY", )", ""),
       "data.synthetic.task: must be COPY, REVERSE or CLASSES"},
      {"CopyOutputLacksSeparator",
       With(kCopy, R"("out_features": 11)", R"("out_features": 10)"),
       "data.synthetic: COPY with vocab_size 10 and length 8 needs a model "
       "output of [16, 11]"},
      {"CopyLengthMismatch", With(kCopy, R"("length": 8)", R"("length": 4)"),
       "data.synthetic: COPY with length 4 needs a model input of INT32 [8]"},
      {"CopyEmbeddingVocabTooSmall",
       With(kCopy, R"("vocab_size": 11)", R"("vocab_size": 10)"),
       "model.layers[0].embedding.vocab_size: 10 is smaller than the 11 "
       "symbols"},
      {"SyntheticNoTrainSamples",
       With(kCopy, R"("train_samples": 2048)", R"("train_samples": 0)"),
       "data.synthetic.train_samples: must be positive, got 0"},
      {"ClassesOneClass", With(kClasses, R"("classes": 4)", R"("classes": 1)"),
       "data.synthetic.classes: must be at least 2, got 1"},
      {"ClassesFeatureMismatch",
       With(kClasses, R"("features": 16)", R"("features": 8)"),
       "data.synthetic: CLASSES with features 8 needs a FLOAT32 model input"},
      {"TextSeqLenMismatch",
       With(kText, R"("seq_len": 64)", R"("seq_len": 32)"),
       "data.text: seq_len 32 needs a model input of INT32 [32], got INT32 "
       "[64]"},
      {"TextNoPath", With(kText, R"("path": "corpus.txt")", R"("path": "")"),
       "data.text.path: must be set"},
      {"TextTestFractionOne",
       With(kText, R"("test_fraction": 0.1)", R"("test_fraction": 1)"),
       "data.text.test_fraction: must be in [0, 1) (0 means the default 0.1), "
       "got 1"},
      // A recorded vocabulary (base64 in JSON): "ab,,", and bytes 0..96.
      {"TextVocabularyRepeats",
       With(kText, R"("test_fraction": 0.1)",
            R"("test_fraction": 0.1, "vocabulary": "YWIsLA==")"),
       "data.text.vocabulary: must hold distinct bytes in ascending order; "
       "byte 44 follows 98"},
      {"TextVocabularyPastTheOutputs",
       With(
           kText, R"("test_fraction": 0.1)",
           R"("test_fraction": 0.1, "vocabulary": "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYA==")"),
       "data.text.vocabulary: 97 tokens (the text's distinct bytes) are more "
       "than the 96 the model scores"},

      // Pipeline layout.
      {"MicroBatchesExceedBatch",
       With(kMlp, R"("micro_batches": 4)", R"("micro_batches": 64)"),
       "pipeline.micro_batches: 64 is larger than batch_size 32"},
      {"BalanceDoesNotSum",
       With(kMlp, R"("balance": [3, 3])", R"("balance": [2, 3])"),
       "pipeline.balance: sums to 5 but the model has 6 layers"},
      {"BalanceHuge",
       With(kMlp, R"("balance": [3, 3])",
            R"("balance": [9223372036854775807, 3])"),
       "pipeline.balance: sums to more than 9223372036854775807 but the "
       "model has 6 layers"},
      {"BalanceWrongLength",
       With(kCopy, R"("balance": [2, 2, 3])", R"("balance": [4, 3])"),
       "pipeline.balance: length 2 does not match pipeline.stages 3"},
      {"BalanceZeroEntry",
       With(kMlp, R"("balance": [3, 3])", R"("balance": [0, 6])"),
       "pipeline.balance[0]: must be positive, got 0"},
      {"StagesExceedLayers", With(kMlp, R"("stages": 2)", R"("stages": 7)"),
       "pipeline.stages: 7 is more than the 6 layers of the model"},
      {"NegativeStages", With(kCnn, R"("stages": 4)", R"("stages": -1)"),
       "pipeline.stages: must be >= 0"},
      {"VirtualStagesWithoutInterleaving",
       With(kMlp, R"("stages": 2)", R"("stages": 2, "virtual_stages": 2)"),
       "pipeline.virtual_stages: virtual stages: 2 chunks per worker need the "
       "interleaved schedule"},
      {"InterleavedWithOneChunk",
       With(kMlp, R"("stages": 2)",
            R"("stages": 2, "schedule": "INTERLEAVED_1F1B", )"
            R"("virtual_stages": 1)"),
       "pipeline.virtual_stages: the interleaved schedule needs 2 or more "
       "virtual stages (chunks per worker), got 1"},
      {"InterleavedMicroBatchesNotAMultiple",
       With(kCopy, R"("stages": 3)",
            R"("stages": 3, "schedule": "INTERLEAVED_1F1B", )"
            R"("virtual_stages": 2)"),
       "pipeline.micro_batches: the interleaved schedule needs micro-batches "
       "to be a multiple of the 3 stages, got 4"},
      {"InterleavedChunksExceedLayers",
       With(kMlp, R"("micro_batches": 4, "balance": [3, 3])",
            R"("micro_batches": 4, "schedule": "INTERLEAVED_1F1B", )"
            R"("virtual_stages": 4)"),
       "pipeline.virtual_stages: 2 stages x 4 chunks is more than the 6 "
       "layers"},
      {"InterleavedBalanceCountsChunks",
       With(kMlp, R"("micro_batches": 4, "balance": [3, 3])",
            R"("micro_batches": 4, "schedule": "INTERLEAVED_1F1B", )"
            R"("virtual_stages": 2, "balance": [3, 3])"),
       "pipeline.balance: length 2 does not match pipeline.stages 2 x "
       "virtual_stages 2"},
      // Data-parallel replicas (kMlp: M = 4, GPIPE; kCnn: M = 8, batch
      // norm, 1F1B).
      {"ReplicasNegative",
       With(kMlp, R"("micro_batches": 4,)",
            R"("micro_batches": 4, "replicas": -2,)"),
       "pipeline.replicas: must be in [0, 64] (0 means 1), got -2"},
      {"ReplicasDoNotDivideMicroBatches",
       With(kMlp, R"("micro_batches": 4,)",
            R"("micro_batches": 4, "replicas": 3,)"),
       "pipeline.replicas: 3 replicas do not divide micro_batches 4"},
      {"GroupsDoNotDivideMicroBatches",
       With(kMlp, R"("micro_batches": 4,)",
            R"("micro_batches": 4, "gradient_groups": 3,)"),
       "pipeline.gradient_groups: 3 gradient groups do not divide "
       "micro_batches 4"},
      {"GroupsMoreThanMicroBatches",
       With(kMlp, R"("micro_batches": 4,)",
            R"("micro_batches": 4, "gradient_groups": 8,)"),
       "pipeline.gradient_groups: must be in [0, 4]"},
      {"ReplicasMoreThanGroups",
       With(kMlp, R"("micro_batches": 4,)",
            R"("micro_batches": 4, "gradient_groups": 2, "replicas": 4,)"),
       "pipeline.replicas: 4 replicas are more than gradient_groups 2"},
      {"ZeroBubbleWithSeveralGroupsPerReplica",
       With(kCnn, R"("schedule": "ONE_F_ONE_B")",
            R"("schedule": "ZERO_BUBBLE_H1", "gradient_groups": 4)"),
       "pipeline.gradient_groups: 4 groups on 1 replica put several groups "
       "on one replica"},
      {"MinStagesExceedStages",
       With(kCnn, R"("min_stages": 2)", R"("min_stages": 5)"),
       "pipeline.min_stages: 5 is more than the 4 stages"},

      {"RebalanceGainTooLarge",
       With(kCnn, R"("min_stages": 2)",
            R"("min_stages": 2, "rebalance": {"min_gain": 1.5})"),
       "pipeline.rebalance.min_gain: must be in [0, 1) (0 means 0.10), got "
       "1.5"},
      {"RebalanceNegativeEvery",
       With(kCnn, R"("min_stages": 2)",
            R"("min_stages": 2, "rebalance": {"every_steps": -1})"),
       "pipeline.rebalance.every_steps: must be in [0, "},
      {"RebalanceWithoutCheckpoints",
       With(kCnn, R"("min_stages": 2)",
            R"("min_stages": 2, "rebalance": {"enabled": true})"),
       "pipeline.rebalance.enabled: needs periodic checkpoints "
       "(checkpoint.every > 0)"},

      // Checkpoints, evaluation, restarts.
      {"NegativeCheckpointEvery",
       With(kMlp, R"("every": 50, "keep")", R"("every": -1, "keep")"),
       "checkpoint.every: must be >= 0, got -1"},
      {"NegativeEvalEvery",
       With(kMlp, R"("eval": {"every": 50})", R"("eval": {"every": -5})"),
       "eval.every: must be >= 0, got -5"},
      {"NegativeRestarts",
       With(kMlp, R"("max_restarts": 3)", R"("max_restarts": -3)"),
       "max_restarts: must be >= 0, got -3"},
  };
}

INSTANTIATE_TEST_SUITE_P(Table, BadSpecTest, ::testing::ValuesIn(BadSpecs()),
                         [](const auto& info) { return info.param.name; });

// Replicas move batch norm's running averages by every micro-batch in
// order (the stages hold the statistics back and gather them), so a model
// with batch norm takes replicas.
TEST(JobSpecTest, ReplicasTakeBatchNorm) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(
      With(kCnn, R"("min_stages": 2)", R"("min_stages": 2, "replicas": 2)"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->pipeline().replicas(), 2);
}

// An interleaved spec without virtual_stages holds 2 chunks a worker, as
// `--schedule interleaved` does; it was refused as if it had said 1.
TEST(JobSpecTest, InterleavedWithoutVirtualStagesHoldsTwoChunks) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(
      With(kMlp, R"("micro_batches": 4, "balance": [3, 3])",
           R"("micro_batches": 4, "schedule": "INTERLEAVED_1F1B")"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(VirtualStageCount(*spec), 2);
}

TEST(JobSpecTest, RebalanceIsOnWithoutABalanceAndWithCheckpoints) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(kCnn);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(RebalanceSettingsOf(*spec).enabled);  // no checkpoints
  spec->mutable_checkpoint()->set_every(10);
  RebalanceSettings r = RebalanceSettingsOf(*spec);
  EXPECT_TRUE(r.enabled);
  EXPECT_EQ(r.after_steps, 20);
  EXPECT_EQ(r.every_steps, 100);
  EXPECT_DOUBLE_EQ(r.min_gain, 0.10);
  spec->mutable_pipeline()->add_balance(8);  // an explicit cut: kept
  EXPECT_FALSE(RebalanceSettingsOf(*spec).enabled);
  spec->mutable_pipeline()->mutable_rebalance()->set_enabled(true);
  spec->mutable_pipeline()->mutable_rebalance()->set_min_gain(0.25);
  r = RebalanceSettingsOf(*spec);
  EXPECT_TRUE(r.enabled);
  EXPECT_DOUBLE_EQ(r.min_gain, 0.25);
}

TEST(JobSpecTest, BadSpecNamesAreUnique) {
  std::vector<std::string> names;
  for (const BadSpec& c : BadSpecs()) names.push_back(c.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
}

TEST(JobSpecTest, InferModelShapesForSmallCnn) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(kCnn);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<ModelShapes> shapes = InferModelShapes(spec->model());
  ASSERT_TRUE(shapes.ok()) << shapes.status();

  const std::vector<Shape> outputs = {{8, 28, 28}, {8, 28, 28}, {8, 28, 28},
                                      {8, 14, 14}, {16, 7, 7},  {16, 7, 7},
                                      {16},        {10}};
  EXPECT_EQ(shapes->outputs, outputs);
  ASSERT_EQ(shapes->inputs.size(), outputs.size());
  EXPECT_EQ(shapes->inputs[0], (Shape{1, 28, 28}));
  for (size_t i = 1; i < outputs.size(); ++i) {
    EXPECT_EQ(shapes->inputs[i], outputs[i - 1]) << "layer " << i;
  }

  ASSERT_EQ(shapes->costs.size(), outputs.size());
  // conv 1->8, 3x3: 2 MACs-worth per output per weight, plus the bias add.
  const LayerCost& conv = shapes->costs[0];
  EXPECT_DOUBLE_EQ(conv.forward_flops, 2.0 * 8 * 28 * 28 * 1 * 9 + 8 * 28 * 28);
  EXPECT_EQ(conv.param_bytes, (8 * 1 * 9 + 8) * 4);
  EXPECT_EQ(conv.activation_bytes, 8 * 28 * 28 * 4);
  EXPECT_EQ(shapes->costs[2].param_bytes, 0);  // relu
  const LayerCost& linear = shapes->costs[7];
  EXPECT_DOUBLE_EQ(linear.forward_flops, 2.0 * 16 * 10 + 10);
  EXPECT_EQ(linear.param_bytes, (16 * 10 + 10) * 4);
  EXPECT_EQ(linear.activation_bytes, 10 * 4);
}

TEST(JobSpecTest, InferModelShapesFlattensAndTracksTokens) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(kCopy);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<ModelShapes> shapes = InferModelShapes(spec->model());
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  EXPECT_EQ(shapes->outputs.front(), (Shape{16, 32}));
  EXPECT_EQ(shapes->outputs.back(), (Shape{16, 11}));
  // The attention costs include the T*T*dim score and value products.
  const double t = 16, dim = 32;
  EXPECT_GT(shapes->costs[3].forward_flops, 2 * (2 * t * t * dim));
  EXPECT_EQ(shapes->costs[0].param_bytes, (11 + 16) * 32 * 4);

  Shape image{2, 4, 4};
  absl::StatusOr<Shape> flat = InferOutputShape(spec->model().layers(0), image,
                                                DType::kF32, "model.layers[0]");
  EXPECT_FALSE(flat.ok());  // the embedding refuses floats
  v1::LayerSpec flatten;
  flatten.mutable_flatten();
  flat = InferOutputShape(flatten, image, DType::kF32, "x");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(*flat, (Shape{32}));
  EXPECT_EQ(LayerKindName(flatten), "flatten");
}

// min_lr above lr would make the decay climb: a typo, refused by name.
TEST(JobSpecTest, AMinimumLearningRateAboveTheRateIsRefused) {
  const std::string decaying =
      With(kMlp, R"("lr": 0.1,)", R"("lr": 0.1, "decay": "LR_DECAY_COSINE",)");
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(With(
      decaying, R"("clip_norm": 1.0)", R"("clip_norm": 1.0, "min_lr": 10)"));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("optimizer.min_lr: 10 is above lr 0.1"));
  spec = ParseJobSpecJson(With(decaying, R"("clip_norm": 1.0)",
                               R"("clip_norm": 1.0, "min_lr": 0.001)"));
  EXPECT_TRUE(spec.ok()) << spec.status();
}

// A null list entry is refused where it is: protobuf's parser dropped it,
// and a null layer vanished from the model. A null value elsewhere is the
// field's default, and a "null" in a string is text. A NUL in the input
// does not cut the message short.
TEST(JobSpecTest, ANullListEntryIsRefusedNamingWhereItIs) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecJson(With(kMlp, R"({"relu": {}},)", R"(null,)"));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("line 7, column 7: null is not a list entry"));
  spec = ParseJobSpecJson(
      With(kMlp, R"("balance": [3, 3])", R"("balance": [3, null])"));
  EXPECT_FALSE(spec.ok());
  spec = ParseJobSpecJson(
      With(kMlp, R"("max_restarts": 3)", R"("max_restarts": null)"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec = ParseJobSpecJson(With(kMlp, R"("name": "mlp")", R"("name": "[null")"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "[null");
  spec = ParseJobSpecJson(std::string("{\"mod\0el\": {}}", 15));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("mod\\0el"));
}

// A key given twice in one object is refused where it is: protobuf's parser
// kept the last value and dropped the first without a word. A field's two
// spellings are one key; the same key in different objects is fine.
TEST(JobSpecTest, AKeyGivenTwiceIsRefusedNamingBothPlaces) {
  absl::StatusOr<v1::JobSpec> spec =
      ParseJobSpecJson(With(kMlp, R"("lr": 0.1,)", R"("lr": 0.1, "lr": 0.5,)"));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("line 15, column 28: \"lr\" is given a second time "
                        "in this object (first at line 15, column 17)"));
  spec = ParseJobSpecJson(With(kMlp, R"("batch_size": 32,)",
                               R"("batch_size": 32, "batchSize": 8,)"));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("batchSize"));
  spec = ParseJobSpecJson(
      With(kMlp, R"({"relu": {}},)", R"({"relu": {}, "relu": {}},)"));
  EXPECT_FALSE(spec.ok());
  // "linear" in every layer and "every" in checkpoint and eval: other objects.
  spec = ParseJobSpecJson(kMlp);
  ASSERT_TRUE(spec.ok()) << spec.status();
  // A key-like string as a value is text.
  spec = ParseJobSpecJson(With(kMlp, R"("name": "mlp")", R"("name": "name")"));
  ASSERT_TRUE(spec.ok()) << spec.status();
}

TEST(JobSpecTest, LoadJobSpecFileNamesThePath) {
  const std::string dir = ::testing::TempDir();
  const std::string missing = dir + "/job_spec_test_missing.json";
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(missing);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(missing));

  const std::string bad = dir + "/job_spec_test_bad.json";
  std::ofstream(bad) << With(kMlp, R"("steps": 100)", R"("steps": 0)");
  spec = LoadJobSpecFile(bad);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              StartsWith(bad + ": steps:"));

  const std::string good = dir + "/job_spec_test_good.json";
  std::ofstream(good) << kCnn;
  spec = LoadJobSpecFile(good);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "cnn");
  std::filesystem::remove(bad);
  std::filesystem::remove(good);

  // An endless file is refused once past what a spec can be, not read
  // into memory to the end (which never came).
  spec = LoadJobSpecFile("/dev/zero");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("/dev/zero: more than 16777216 bytes is too large"));
}

TEST(JobSpecTest, ExamplesValidate) {
  const std::filesystem::path dir =
      std::filesystem::path(GPIPE_SOURCE_DIR) / "examples";
  int checked = 0;
  if (std::filesystem::is_directory(dir)) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() != ".json") continue;
      absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(entry.path().string());
      EXPECT_TRUE(spec.ok()) << spec.status();
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << "no examples/*.json yet";
}

TEST(JobSpecTest, RelativeDataPathsBecomeTheSubmittersAbsolutePaths) {
  v1::JobSpec spec;
  spec.mutable_data()->mutable_tokens()->set_path("data/train.bin");
  spec.mutable_data()->mutable_tokens()->set_test_path("./data/../val.bin");
  ResolveDataPaths("/home/me/project", &spec);
  EXPECT_EQ(spec.data().tokens().path(), "/home/me/project/data/train.bin");
  EXPECT_EQ(spec.data().tokens().test_path(), "/home/me/project/val.bin");
  spec.mutable_data()->mutable_text()->set_path("/srv/corpus.txt");
  ResolveDataPaths("/elsewhere", &spec);
  EXPECT_EQ(spec.data().text().path(), "/srv/corpus.txt");  // absolute: kept
  spec.mutable_data()->mutable_fashion_mnist();  // empty dir: the default
  ResolveDataPaths("/elsewhere", &spec);
  EXPECT_EQ(spec.data().fashion_mnist().dir(), "");
}

}  // namespace
}  // namespace gpipe
