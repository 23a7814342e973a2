// Activation memory per stage, from each stage's counting allocator:
// re-materialization keeps only the stage's input per micro-batch plus one
// micro-batch's internal activations (GPipe's O(N + L/K * N/M)).
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"

namespace gpipe {
namespace {

constexpr int64_t kWidth = 64, kBatch = 64, kMicroBatches = 8;

// A 32-layer MLP: 16 x (Linear 64->64, ReLU), the last Linear to 4 classes.
gpipe::v1::JobSpec DeepMlp() {
  std::string layers;
  for (int i = 0; i < 16; ++i) {
    const int out = i == 15 ? 4 : kWidth;
    layers += absl::StrCat(i ? "," : "",
                           R"({"linear": {"inFeatures": 64, "outFeatures": )",
                           out, "}}");
    if (i != 15)
      layers += R"(,{"relu": {}})";
    else
      layers += R"(,{"tanh": {}})";
  }
  const std::string json = absl::StrCat(R"({
    "model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [64]}},
              "layers": [)",
                                        layers, R"(],
              "loss": {"softmaxCrossEntropy": {}}},
    "optimizer": {"lr": 0.01, "sgd": {}},
    "data": {"synthetic": {"task": "CLASSES", "features": 64, "classes": 4,
                           "trainSamples": 256, "testSamples": 16}},
    "batchSize": 64, "steps": 2, "seed": 1})");
  auto spec = ParseJobSpecJson(json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::vector<int64_t> PeakBytes(RematMode remat, ScheduleKind schedule) {
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = kMicroBatches;
  o.remat = remat;
  o.schedule = schedule;
  o.balance = {16, 16};
  auto p = InProcessPipeline::Create(DeepMlp(), o);
  EXPECT_TRUE(p.ok()) << p.status();
  for (int s = 0; s < 2; ++s) EXPECT_TRUE((*p)->Step().ok());
  return {(*p)->stage(0).peak_activation_bytes(),
          (*p)->stage(1).peak_activation_bytes()};
}

TEST(PipelineMemory, RematIsAtLeastThreeTimesSmaller) {
  const auto with = PeakBytes(RematMode::kAlways, ScheduleKind::kGPipe);
  const auto without = PeakBytes(RematMode::kNever, ScheduleKind::kGPipe);
  for (int s = 0; s < 2; ++s) {
    std::printf("stage %d: peak %lld bytes with remat, %lld without\n", s,
                static_cast<long long>(with[s]),
                static_cast<long long>(without[s]));
    EXPECT_GE(without[s], 3 * with[s]) << "stage " << s;
  }
}

TEST(PipelineMemory, RematStaysWithinGPipesBound) {
  const auto with = PeakBytes(RematMode::kAlways, ScheduleKind::kGPipe);
  const int64_t mb = kBatch / kMicroBatches;
  const int64_t row = kWidth * 4;  // bytes of one sample's activation
  // The stage's inputs for all M micro-batches, one micro-batch's 16 layer
  // outputs, and the few micro-batch-sized tensors a forward or backward has
  // in hand at once (current activation, incoming and outgoing gradient, and
  // on the last stage the loss gradient of each micro-batch).
  const int64_t boundary = kMicroBatches * mb * row;
  const int64_t internal = 16 * mb * row;
  const int64_t working = 3 * mb * row;
  const int64_t loss_gradients = kMicroBatches * mb * 4 * 4;
  EXPECT_GT(with[0], 0);
  EXPECT_LE(with[0], boundary + internal + working);
  EXPECT_LE(with[1], boundary + internal + working + loss_gradients);
}

TEST(PipelineMemory, OneFOneBHoldsFewerMicroBatchesThanGPipe) {
  const auto gpipe = PeakBytes(RematMode::kNever, ScheduleKind::kGPipe);
  const auto one_f_one_b =
      PeakBytes(RematMode::kNever, ScheduleKind::kOneFOneB);
  // Stage 0 keeps at most K=2 micro-batches alive instead of M=8.
  EXPECT_LT(2 * one_f_one_b[0], gpipe[0]);
}

// ZB-H1 holds K micro-batches between F and W on every stage (1F1B: K - s
// on stage s): its first stage's peak is 1F1B's first stage's, plus one
// micro-batch's deferred output gradients (its W follows its B at once).
TEST(PipelineMemory, ZeroBubbleH1HoldsAsManyAsOneFOneBsFirstStage) {
  const auto one_f_one_b =
      PeakBytes(RematMode::kNever, ScheduleKind::kOneFOneB);
  const auto zb = PeakBytes(RematMode::kNever, ScheduleKind::kZeroBubbleH1);
  const int64_t mb = kBatch / kMicroBatches;
  const int64_t deferred = 16 * mb * kWidth * 4;  // 16 Linears' dy
  std::printf("peak 1f1b %lld, %lld; zb-h1 %lld, %lld bytes\n",
              static_cast<long long>(one_f_one_b[0]),
              static_cast<long long>(one_f_one_b[1]),
              static_cast<long long>(zb[0]), static_cast<long long>(zb[1]));
  EXPECT_LE(zb[0], one_f_one_b[0] + deferred);
  EXPECT_GT(zb[1], one_f_one_b[1]);  // the last stage holds 2, not 1
}

}  // namespace
}  // namespace gpipe
