// The memory model against the allocator: what a forward keeps for its
// backward must be exactly what the model says, layer kind by layer kind and
// for every range of layers a stage could get; a whole stage's measured peak
// must stay within the model's estimate, and not far below it.
#include "services/pipeline/memory_model.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/nn/model.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/partitioner.h"
#include "services/tensor/allocator.h"

namespace gpipe {
namespace {

v1::JobSpec Spec(const std::string& input, const std::string& layers,
                 const std::string& data, const std::string& optimizer,
                 const std::string& pipeline) {
  auto spec = ParseJobSpecJson(
      absl::StrCat(R"({"model": {"input": )", input, R"(, "layers": [)", layers,
                   R"(], "loss": {"softmaxCrossEntropy": {}}}, "optimizer": )",
                   optimizer, R"(, "data": )", data, R"(, "pipeline": )",
                   pipeline, R"(, "batchSize": 16, "steps": 2, "seed": 3})"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

v1::JobSpec Mlp(const std::string& pipeline = "{}") {
  return Spec(R"({"dtype": "FLOAT32", "shape": {"dims": [12]}})",
              R"({"linear": {"inFeatures": 12, "outFeatures": 32}},
                 {"relu": {}}, {"dropout": {"p": 0.25}},
                 {"linear": {"inFeatures": 32, "outFeatures": 24}},
                 {"tanh": {}},
                 {"linear": {"inFeatures": 24, "outFeatures": 24}},
                 {"gelu": {}}, {"dropout": {"p": 0}},
                 {"layerNorm": {"features": 24}},
                 {"linear": {"inFeatures": 24, "outFeatures": 4}},
                 {"relu": {}})",
              R"({"synthetic": {"task": "CLASSES", "features": 12,
                  "classes": 4, "trainSamples": 64, "testSamples": 16}})",
              R"({"lr": 0.01, "sgd": {"momentum": 0.9}})", pipeline);
}

v1::JobSpec Cnn(const std::string& pipeline = "{}") {
  return Spec(R"({"dtype": "FLOAT32", "shape": {"dims": [1, 28, 28]}})",
              R"({"conv2d": {"inChannels": 1, "outChannels": 4,
                             "kernelSize": 3, "padding": 1}},
                 {"batchNorm": {"features": 4}}, {"relu": {}},
                 {"maxPool2d": {"kernelSize": 2}},
                 {"conv2d": {"inChannels": 4, "outChannels": 6,
                             "kernelSize": 3}},
                 {"flatten": {}},
                 {"linear": {"inFeatures": 864, "outFeatures": 16}},
                 {"batchNorm": {"features": 16}},
                 {"linear": {"inFeatures": 16, "outFeatures": 10}})",
              R"({"fashionMnist": {}})", R"({"lr": 0.01, "sgd": {}})",
              pipeline);
}

v1::JobSpec Transformer(const std::string& pipeline = "{}") {
  return Spec(R"({"dtype": "INT32", "shape": {"dims": [8]}})",
              R"({"embedding": {"vocabSize": 9, "dim": 16, "maxPositions": 8}},
                 {"transformerBlock": {"dim": 16, "heads": 2}},
                 {"selfAttention": {"dim": 16, "heads": 4}},
                 {"layerNorm": {"features": 16}},
                 {"transformerBlock": {"dim": 16, "heads": 4, "dropout": 0.1}},
                 {"linear": {"inFeatures": 16, "outFeatures": 9}})",
              R"({"synthetic": {"task": "REVERSE", "vocabSize": 8,
                  "length": 4, "trainSamples": 256, "testSamples": 16}})",
              R"({"lr": 0.01, "adamw": {}})", pipeline);
}

// An input for layers [begin, ...): ids for an embedding, values otherwise.
Tensor Input(const v1::JobSpec& spec, const ModelShapes& shapes, int64_t begin,
             int64_t samples) {
  const Shape shape = shapes.inputs[begin].WithBatch(samples);
  if (begin == 0 && spec.model().input().dtype() == v1::INT32) {
    std::vector<int32_t> ids(shape.numel());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i % 9);
    return Tensor::FromInts(shape, ids);
  }
  std::vector<float> v(shape.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * ((i * 37) % 101) - 0.5f;
  return Tensor::FromVector(shape, v);
}

void ExpectSavedBytesExact(const v1::JobSpec& spec) {
  auto shapes = InferModelShapes(spec.model());
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  const int64_t layers = spec.model().layers_size();
  constexpr int64_t kSamples = 5;
  for (int64_t b = 0; b < layers; ++b) {
    for (int64_t e = b + 1; e <= layers; ++e) {
      auto model = Model::Build(spec.model(), spec.seed(), b, e);
      ASSERT_TRUE(model.ok()) << model.status();
      CpuAllocator host;
      CountingAllocator counted(&host);
      {
        AllocatorScope scope(&counted);
        std::vector<Saved> saved;
        {
          Tensor x = Input(spec, *shapes, b, kSamples);
          LayerContext ctx;
          ctx.seed = 1;
          Tensor y = (*model)->Forward(x, ctx, &saved);
        }
        EXPECT_EQ(counted.current_bytes(),
                  SavedActivationBytes(*shapes, b, e, kSamples))
            << "layers [" << b << ", " << e << ") of " << spec.name();
      }
    }
  }
}

TEST(MemoryModel, SavedActivationsOfEveryLayerRangeAreExact) {
  ExpectSavedBytesExact(Mlp());
  ExpectSavedBytesExact(Cnn());
  ExpectSavedBytesExact(Transformer());
}

// The measured peak of each stage's step (its counting allocator) against
// the model's activations and working memory.
// `tight`: also within 2x (stages of a layer or two are all working memory
// for evaluation, which a training step does not measure).
void ExpectPeaksWithinEstimate(const v1::JobSpec& spec, bool tight = true) {
  auto shapes = InferModelShapes(spec.model());
  ASSERT_TRUE(shapes.ok());
  auto balance = PartitionJob(spec, ChunkCount(spec));
  ASSERT_TRUE(balance.ok());
  const std::vector<StageMemory> model =
      EstimatePipelineMemory(spec, *shapes, *balance);
  PipelineOptions o = OptionsFromSpec(spec);
  o.balance = *balance;
  auto pipeline = InProcessPipeline::Create(spec, o);
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  for (int s = 0; s < 2; ++s) ASSERT_TRUE((*pipeline)->Step().ok());
  for (size_t s = 0; s < model.size(); ++s) {
    const int64_t measured = (*pipeline)->stage(s).peak_activation_bytes();
    const int64_t estimate = model[s].training();
    SCOPED_TRACE(absl::StrCat(spec.pipeline().ShortDebugString(), " stage ", s,
                              ": measured ", measured, ", estimate ", estimate,
                              " = ", model[s].ToString()));
    EXPECT_LE(measured, estimate);
    if (tight) EXPECT_LE(estimate, 2 * measured + 4096);
  }
}

TEST(MemoryModel, StagePeaksStayWithinTheEstimate) {
  for (const char* schedule : {"GPIPE", "ONE_F_ONE_B", "ZERO_BUBBLE_H1"}) {
    for (const char* remat : {"ALWAYS", "NEVER", "EXCEPT_LAST"}) {
      const std::string p =
          absl::StrCat(R"({"stages": 3, "microBatches": 4, "schedule": ")",
                       schedule, R"(", "remat": ")", remat, R"("})");
      ExpectPeaksWithinEstimate(Mlp(p));
      ExpectPeaksWithinEstimate(Transformer(p));
    }
  }
  // Interleaved: 2 workers of 2 chunks, each chunk estimated on its own.
  for (const char* remat : {"ALWAYS", "NEVER", "EXCEPT_LAST"}) {
    const std::string p = absl::StrCat(
        R"({"stages": 2, "virtualStages": 2, "microBatches": 4, )",
        R"("schedule": "INTERLEAVED_1F1B", "remat": ")", remat, R"("})");
    ExpectPeaksWithinEstimate(Mlp(p));
    // Chunks of one or two of its six layers: an upper bound only.
    ExpectPeaksWithinEstimate(Transformer(p), /*tight=*/false);
  }
}

// Gradient groups on one stage (G = 8, one replica): the tree's sums held
// until the step's end stay within the estimate.
TEST(MemoryModel, GradientGroupsStayWithinTheEstimate) {
  for (const char* schedule : {"GPIPE", "ONE_F_ONE_B"}) {
    const std::string p = absl::StrCat(
        R"({"stages": 2, "microBatches": 8, "gradientGroups": 8, )",
        R"("schedule": ")", schedule, R"("})");
    ExpectPeaksWithinEstimate(Mlp(p), /*tight=*/false);
    ExpectPeaksWithinEstimate(Transformer(p), /*tight=*/false);
  }
}

TEST(MemoryModel, ParametersGradientsAndOptimizerState) {
  const v1::JobSpec spec = Transformer(R"({"stages": 2})");
  auto shapes = InferModelShapes(spec.model());
  ASSERT_TRUE(shapes.ok());
  const std::vector<StageMemory> m =
      EstimatePipelineMemory(spec, *shapes, {2, 4});
  auto first = Model::Build(spec.model(), spec.seed(), 0, 2);
  ASSERT_TRUE(first.ok());
  int64_t bytes = 0;
  for (const NamedTensor& t : (*first)->StateTensors())
    bytes += t.tensor->nbytes();
  EXPECT_EQ(m[0].parameters, bytes);
  EXPECT_EQ(m[0].gradients, bytes);
  EXPECT_EQ(m[0].optimizer_state, 2 * bytes);  // AdamW: two moments
  // The synthetic data is made on demand: the sampler's permutations only.
  EXPECT_EQ(m[0].data, 3 * 8 * 256);
  EXPECT_EQ(m[1].data, m[0].data);
}

TEST(MemoryModel, ReadsAsPeopleWriteIt) {
  StageMemory m;
  m.parameters = int64_t{3} << 30;
  m.activations = 1536;
  EXPECT_EQ(m.ToString(),
            "3.00 GiB (parameters 3.00 GiB, gradients 0 B, optimizer 0 B, "
            "activations 1.50 KiB, working 0 B, evaluation 0 B, batch 0 B, "
            "data 0 B)");
  // Totals saturate: an absurd stage is too large, never small.
  StageMemory absurd;
  absurd.parameters = std::numeric_limits<int64_t>::max() - 1;
  absurd.activations = 10;
  absurd.working = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(absurd.training(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(absurd.total(), std::numeric_limits<int64_t>::max());
}

// Every example at its own K and M, under GPipe, 1F1B and ZB-H1: a training
// step's peak (what gpipe_stage_activation_memory_bytes shows) and an
// evaluation's, measured by each stage's allocator, against the model.
// Both are upper bounds; evaluation within 15%, a training step within 35%
// (the first stage's activation in flight to the next is counted for the
// whole step), ZB-H1's within 75% (a micro-batch's input half counts its
// whole record beside all the gradients it makes).
TEST(MemoryModel, EveryExamplesPeaksAgainstTheEstimate) {
  for (const char* name :
       {"fashion_mnist_mlp.json", "fashion_mnist_deep_mlp.json",
        "fashion_mnist_cnn.json", "char_transformer.json"}) {
    for (const v1::Schedule schedule :
         {v1::GPIPE, v1::ONE_F_ONE_B, v1::ZERO_BUBBLE_H1}) {
      auto spec =
          LoadJobSpecFile(std::string(GPIPE_SOURCE_DIR) + "/examples/" + name);
      ASSERT_TRUE(spec.ok()) << spec.status();
      spec->mutable_pipeline()->set_schedule(schedule);
      auto shapes = InferModelShapes(spec->model());
      ASSERT_TRUE(shapes.ok());
      auto balance = PartitionJob(*spec, ChunkCount(*spec));
      ASSERT_TRUE(balance.ok());
      const std::vector<StageMemory> model =
          EstimatePipelineMemory(*spec, *shapes, *balance);
      PipelineOptions o = OptionsFromSpec(*spec);
      o.balance = *balance;
      auto pipeline = InProcessPipeline::Create(*spec, o);
      ASSERT_TRUE(pipeline.ok()) << pipeline.status();
      for (int s = 0; s < 2; ++s) ASSERT_TRUE((*pipeline)->Step().ok());
      ASSERT_TRUE((*pipeline)->Evaluate(Split::kTest, 0).ok());
      const double slack = schedule == v1::ZERO_BUBBLE_H1 ? 1.75 : 1.35;
      for (size_t s = 0; s < model.size(); ++s) {
        const Stage& stage = (*pipeline)->stage(s);
        const int64_t train = stage.peak_activation_bytes();
        const int64_t eval = stage.peak_evaluation_bytes();
        SCOPED_TRACE(absl::StrCat(name, " ", v1::Schedule_Name(schedule),
                                  " stage ", s, ": measured training ", train,
                                  ", evaluation ", eval, "; estimate ",
                                  model[s].ToString()));
        EXPECT_LE(train, model[s].training());
        EXPECT_LE(model[s].training(), slack * train);
        EXPECT_LE(eval, model[s].evaluation);
        EXPECT_LE(model[s].evaluation, 1.15 * eval);
      }
    }
  }
}

}  // namespace
}  // namespace gpipe
