// Layers, the loss, the optimizers and whole training runs on the GPU against
// the CPU. Layers agree within 1e-4 relative (cuBLAS sums in another order);
// a training run on the GPU reaches the CPU's accuracy band. Skipped when no
// GPU is present; the device errors are checked everywhere.
#include <memory>
#include <string>
#include <vector>

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/nn/layers/activations.h"
#include "services/nn/layers/attention.h"
#include "services/nn/layers/dropout.h"
#include "services/nn/layers/embedding.h"
#include "services/nn/layers/layer_norm.h"
#include "services/nn/layers/linear.h"
#include "services/nn/layers/transformer_block.h"
#include "services/nn/model.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/reference_trainer.h"
#include "services/tensor/device.h"
#include "services/tensor/ops.h"
#include "tests/support/cuda_test_util.h"

namespace gpipe::cuda_test {
namespace {

class CudaLayersTest : public CudaTest {};

TEST_F(CudaLayersTest, Linear) {
  Linear a(96, 40, true), b(96, 40, true);
  CompareLayer(a, b, {33, 96}, 1e-4);
  Linear c(16, 8, false), d(16, 8, false);
  CompareLayer(c, d, {4, 5, 16}, 1e-4);
}

TEST_F(CudaLayersTest, Activations) {
  ReLU r1, r2;
  CompareLayer(r1, r2, {64, 33}, 0);
  GELU g1, g2;
  CompareLayer(g1, g2, {64, 33}, 1e-5);
  Tanh t1, t2;
  CompareLayer(t1, t2, {64, 33}, 1e-5);
}

TEST_F(CudaLayersTest, DropoutMasksMatchTheCpu) {
  Dropout a(0.3f), b(0.3f);
  CompareLayer(a, b, {50, 70}, 0);
}

TEST_F(CudaLayersTest, LayerNorm) {
  LayerNorm a(48, 1e-5f), b(48, 1e-5f);
  CompareLayer(a, b, {6, 7, 48}, 1e-4);
}

TEST_F(CudaLayersTest, SelfAttentionAndTransformerBlock) {
  SelfAttention a(32, 4, true), b(32, 4, true);
  CompareLayer(a, b, {3, 9, 32}, 1e-4);
  SelfAttention c(16, 2, false), d(16, 2, false);
  CompareLayer(c, d, {2, 5, 16}, 1e-4);
  TransformerBlock e(32, 4, 64, 0.1f, true), f(32, 4, 64, 0.1f, true);
  CompareLayer(e, f, {2, 7, 32}, 1e-4);
}

// Sequences longer than a warp (the GPU's row softmaxes loop), odd lengths,
// one head and many: the batched-GEMM attention against the CPU's loops.
TEST_F(CudaLayersTest, SelfAttentionLongSequences) {
  SelfAttention a(64, 4, true), b(64, 4, true);
  CompareLayer(a, b, {3, 70, 64}, 1e-4);
  SelfAttention c(48, 1, false), d(48, 1, false);
  CompareLayer(c, d, {2, 45, 48}, 1e-4);
  SelfAttention e(64, 16, true), f(64, 16, true);
  CompareLayer(e, f, {1, 129, 64}, 1e-4);
}

// The same inputs give the same bits, run after run.
TEST_F(CudaLayersTest, SelfAttentionIsReproducible) {
  SelfAttention a(32, 4, true);
  a.Initialize(3);
  MoveState(a, kCuda);
  LayerContext ctx;
  Tensor x = Random({2, 40, 32}, 4).To(kCuda);
  Tensor dy = Random({2, 40, 32}, 5).To(kCuda);
  Saved s1, s2;
  Tensor y1 = a.Forward(x, ctx, &s1), y2 = a.Forward(x, ctx, &s2);
  EXPECT_TRUE(BitwiseEqual(y1, y2));
  Tensor dx1 = a.Backward(dy, s1, ctx), dx2 = a.Backward(dy, s2, ctx);
  EXPECT_TRUE(BitwiseEqual(dx1, dx2));
}

TEST_F(CudaLayersTest, EmbeddingIsBitwiseTheCpu) {
  Embedding cpu(11, 8, 6), gpu(11, 8, 6);
  cpu.Initialize(5);
  gpu.Initialize(5);
  MoveState(gpu, kCuda);
  // Out-of-range ids are clamped on both devices; repeated ids accumulate.
  Tensor ids = Tensor::FromInts(
      {3, 6}, {0, 1, 2, 3, 4, 5, 10, 10, 10, -3, 99, 7, 1, 1, 1, 2, 2, 2});
  LayerContext ctx;
  Saved s1, s2;
  Tensor y = cpu.Forward(ids, ctx, &s1);
  Tensor gy = gpu.Forward(ids.To(kCuda), ctx, &s2);
  EXPECT_TRUE(BitwiseEqual(y, gy));
  Tensor dy = Random(y.shape(), 3);
  cpu.Backward(dy, s1, ctx);
  gpu.Backward(dy.To(kCuda), s2, ctx);
  std::vector<Parameter*> pc = cpu.Parameters(), pg = gpu.Parameters();
  for (size_t i = 0; i < pc.size(); ++i)
    EXPECT_TRUE(BitwiseEqual(pc[i]->grad, pg[i]->grad)) << pc[i]->name;
}

gpipe::v1::JobSpec ClassesSpec(const std::string& optimizer, int steps) {
  absl::StatusOr<gpipe::v1::JobSpec> spec = ParseJobSpecJson(R"({
    "name": "cuda-mlp",
    "model": {
      "input": {"dtype": "FLOAT32", "shape": {"dims": [32]}},
      "layers": [
        {"linear": {"inFeatures": 32, "outFeatures": 64}}, {"gelu": {}},
        {"dropout": {"p": 0.1}},
        {"linear": {"inFeatures": 64, "outFeatures": 64}}, {"tanh": {}},
        {"layerNorm": {"features": 64}}, {"relu": {}},
        {"linear": {"inFeatures": 64, "outFeatures": 8}}
      ],
      "loss": {"softmaxCrossEntropy": {}}
    },
    "optimizer": {"lr": 0.01, )" + optimizer + R"(, "clipNorm": 1.0},
    "data": {"synthetic": {"task": "CLASSES", "features": 32, "classes": 8,
                            "trainSamples": 4096, "testSamples": 1024}},
    "pipeline": {"microBatches": 2},
    "batchSize": 64,
    "steps": )" + std::to_string(steps) + R"(,
    "seed": 3
  })");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// A few steps with SGD+momentum and with AdamW: parameters stay within fp32
// rounding of the CPU's (the optimizer kernels, the clipping norm and every
// layer together).
TEST_F(CudaLayersTest, OptimizerStepsTrackTheCpu) {
  for (const char* opt : {R"("sgd": {"momentum": 0.9, "weightDecay": 0.01})",
                          R"("adamw": {"weightDecay": 0.01})"}) {
    SCOPED_TRACE(opt);
    const gpipe::v1::JobSpec spec = ClassesSpec(opt, 5);
    auto cpu = ReferenceTrainer::Create(spec, 0, nullptr, kCpu);
    auto gpu = ReferenceTrainer::Create(spec, 0, nullptr, kCuda);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    for (int s = 0; s < 5; ++s) {
      absl::StatusOr<StepReport> a = (*cpu)->Step(), b = (*gpu)->Step();
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_NEAR(a->loss, b->loss, 1e-4 * (1 + a->loss)) << "step " << s;
      EXPECT_NEAR(a->grad_norm, b->grad_norm, 1e-4 * (1 + a->grad_norm));
    }
    const std::vector<NamedTensor> pa = (*cpu)->StateTensors(),
                                   pb = (*gpu)->StateTensors();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pb[i].tensor->device(), kCuda);
      EXPECT_LE(MaxRelError(*pa[i].tensor, *pb[i].tensor), 1e-3) << pa[i].name;
    }
  }
}

// The GPU run learns as the CPU run does: a few hundred steps end in the
// same accuracy band.
TEST_F(CudaLayersTest, TrainingReachesTheCpuAccuracy) {
  const gpipe::v1::JobSpec spec = ClassesSpec(R"("adamw": {})", 300);
  auto cpu = ReferenceTrainer::Create(spec, 0, nullptr, kCpu);
  auto gpu = ReferenceTrainer::Create(spec, 0, nullptr, kCuda);
  ASSERT_TRUE(cpu.ok() && gpu.ok());
  for (int s = 0; s < 300; ++s) {
    ASSERT_TRUE((*cpu)->Step().ok());
    ASSERT_TRUE((*gpu)->Step().ok());
  }
  absl::StatusOr<EvalResult> a = (*cpu)->Evaluate(Split::kTest);
  absl::StatusOr<EvalResult> b = (*gpu)->Evaluate(Split::kTest);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(a->accuracy, 0.8);
  EXPECT_NEAR(a->accuracy, b->accuracy, 0.02);
  EXPECT_NEAR(a->loss, b->loss, 0.05 * (1 + a->loss));
}

// bf16 compute (fp32 master weights) learns as well: the same run with the
// GPU's GEMMs on bf16 operands ends in the CPU's accuracy band.
TEST_F(CudaLayersTest, Bf16TrainingReachesTheCpuAccuracy) {
  if (!RealGpu()) GTEST_SKIP() << "the fake device computes GEMMs in fp32";
  const gpipe::v1::JobSpec spec = ClassesSpec(R"("adamw": {})", 300);
  auto cpu = ReferenceTrainer::Create(spec, 0, nullptr, kCpu);
  auto gpu = ReferenceTrainer::Create(spec, 0, nullptr, kCuda);
  ASSERT_TRUE(cpu.ok() && gpu.ok());
  ops::GemmPrecisionScope bf16(ops::GemmPrecision::kBf16);
  for (int s = 0; s < 300; ++s) {
    ASSERT_TRUE((*cpu)->Step().ok());
    ASSERT_TRUE((*gpu)->Step().ok());
  }
  for (const NamedTensor& t : (*gpu)->StateTensors())
    EXPECT_EQ(t.tensor->dtype(), DType::kF32) << t.name;
  absl::StatusOr<EvalResult> a = (*cpu)->Evaluate(Split::kTest);
  absl::StatusOr<EvalResult> b = (*gpu)->Evaluate(Split::kTest);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_GT(a->accuracy, 0.8);
  EXPECT_NEAR(a->accuracy, b->accuracy, 0.03);
  EXPECT_NEAR(a->loss, b->loss, 0.1 * (1 + a->loss));
}

// The char transformer example's model (embedding, blocks, head) on the
// GPU: the first steps' losses track the CPU's.
TEST_F(CudaLayersTest, TransformerStepsTrackTheCpu) {
  absl::StatusOr<gpipe::v1::JobSpec> spec =
      LoadExample("char_transformer.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto cpu = ReferenceTrainer::Create(*spec, 0, nullptr, kCpu);
  auto gpu = ReferenceTrainer::Create(*spec, 0, nullptr, kCuda);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ExpectLossesTrack(**cpu, **gpu, 4, 1e-3);
}

// Runs everywhere: every layer has CUDA kernels now, so a convolutional
// model moves to the GPU when there is one, and the error without one is
// clear.
TEST(CudaDeviceErrorsTest, ConvModelMovesOrSaysWhyNot) {
  gpipe::v1::ModelSpec spec;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(R"({
      "input": {"dtype": "FLOAT32", "shape": {"dims": [1, 8, 8]}},
      "layers": [{"conv2d": {"inChannels": 1, "outChannels": 2,
                             "kernelSize": 3}},
                 {"batchNorm": {"features": 2}},
                 {"maxPool2d": {"kernelSize": 2}},
                 {"flatten": {}},
                 {"linear": {"inFeatures": 18, "outFeatures": 2}}],
      "loss": {"softmaxCrossEntropy": {}}})",
                                                          &spec)
                  .ok());
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Build(spec, 1);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::Status s = (*model)->To(kCuda);
  if (CudaAvailable()) {
    EXPECT_TRUE(s.ok()) << s;
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(s.message().empty());
  }
  EXPECT_TRUE((*model)->To(kCpu).ok());
}

}  // namespace
}  // namespace gpipe::cuda_test
