// The fake device (services/tensor/fake_device.h): device tensors whose
// memory faults when host code touches it outside a kernel or a copy, and
// kernels that are the CPU's. A stage on it trains to the CPU's bits, and
// its checkpoints and final parameters go through the host copies that a
// real GPU needs.
#include "services/tensor/fake_device.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/nn/generator.h"
#include "services/nn/model.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/link_reduction.h"
#include "services/pipeline/stage.h"
#include "services/pipeline/stage_checkpoint.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors.h"
#include "services/tensor/device.h"
#include "services/tensor/device_transfer.h"
#include "services/tensor/ops.h"
#include "services/tensor/tensor.h"

namespace gpipe {
namespace {

namespace v1 = gpipe::v1;
using ::testing::HasSubstr;

// Before main, so that FakeDeviceEnabled() (read once) sees it; gtest's
// death tests re-run this binary and inherit it.
const bool kFakeDeviceOn = [] {
  setenv("GPIPE_FAKE_DEVICE", "1", 1);
  return true;
}();

constexpr char kDeathMessage[] = "host code touched device memory";

TEST(FakeDeviceTest, StandsInForTheGpu) {
  ASSERT_TRUE(kFakeDeviceOn && FakeDeviceEnabled());
  EXPECT_TRUE(CudaAvailable());
  EXPECT_THAT(CudaDescription(), HasSubstr("fake GPU"));
  absl::StatusOr<Device> d = ResolveDevice("cuda");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, Device::kCuda);
  EXPECT_EQ(*ResolveDevice("auto"), Device::kCuda);
}

TEST(FakeDeviceTest, HostReadOfDeviceMemoryDiesNamingTheCause) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor t = Tensor::FromVector({4}, {1, 2, 3, 4}).To(Device::kCuda);
  EXPECT_DEATH(
      {
        volatile float x = t.f32()[2];
        (void)x;
      },
      kDeathMessage);
}

TEST(FakeDeviceTest, HostWriteIntoDeviceMemoryDies) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // What restoring a checkpoint with memcpy did (issue finding 2).
  Tensor t = Tensor::Zeros({4}, DType::kF32, Device::kCuda);
  const float v[4] = {1, 2, 3, 4};
  EXPECT_DEATH(std::memcpy(t.raw(), v, sizeof v), kDeathMessage);
}

TEST(FakeDeviceTest, CopiesAndKernelsComputeTheCpuBits) {
  Tensor a = Tensor::FromVector(
      {3, 4}, {1, -2, 3, -4, 5, -6, 7, -8, 9, -1, 0.5f, -0.25f});
  Tensor b = Tensor::FromVector({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Tensor da = a.To(Device::kCuda), db = b.To(Device::kCuda);
  EXPECT_EQ(da.device(), Device::kCuda);
  EXPECT_TRUE(BitwiseEqual(a, da));
  Tensor c = Tensor::Empty({3, 2});
  Tensor dc = Tensor::Empty({3, 2}, DType::kF32, Device::kCuda);
  ops::Gemm(Device::kCpu, false, false, 3, 2, 4, 1.0f, a.f32(), b.f32(), 0.0f,
            c.f32());
  ops::Gemm(Device::kCuda, false, false, 3, 2, 4, 1.0f, da.f32(), db.f32(),
            0.0f, dc.f32());
  EXPECT_TRUE(BitwiseEqual(c, dc));
  ops::ReluForward(Device::kCuda, da.numel(), da.f32(), da.f32());
  EXPECT_EQ(da.ToVector()[1], 0.0f);
  EXPECT_EQ(ops::SumSquares(Device::kCuda, db.numel(), db.f32()),
            ops::SumSquares(Device::kCpu, b.numel(), b.f32()));
  Tensor z = da.Clone();
  z.SetZero();
  EXPECT_EQ(z.ToVector(), std::vector<float>(12, 0.0f));
}

TEST(FakeDeviceTest, TransferCopiesThroughTheStagesAllocator) {
  std::unique_ptr<DeviceTransfer> transfer = DeviceTransfer::Create();
  ASSERT_NE(transfer, nullptr);
  Tensor host = Tensor::FromVector({2, 3}, {1, 2, 3, 4, 5, 6});
  {
    DeviceTransfer::Scope scope(transfer.get());
    Tensor d = transfer->ToDevice(host);
    EXPECT_EQ(d.device(), Device::kCuda);
    EXPECT_EQ(transfer->activations().current_bytes(), 24);
    Tensor back = transfer->ToHost(d);
    EXPECT_EQ(back.device(), Device::kCpu);
    EXPECT_TRUE(BitwiseEqual(host, back));
  }
  EXPECT_EQ(transfer->activations().current_bytes(), 0);
}

// Stages of a small model with BatchNorm, AdamW and clipping, on the CPU and
// on the fake device.
class FakeDeviceStageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(R"({
      "name": "fake-device-test",
      "model": {
        "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
        "layers": [
          {"linear": {"inFeatures": 8, "outFeatures": 16}},
          {"batchNorm": {"features": 16}},
          {"gelu": {}},
          {"layerNorm": {"features": 16}},
          {"linear": {"inFeatures": 16, "outFeatures": 3}}
        ],
        "loss": {"softmaxCrossEntropy": {}}
      },
      "optimizer": {"lr": 0.01, "adamw": {}, "clipNorm": 0.5},
      "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                             "trainSamples": 64, "testSamples": 16}},
      "batchSize": 8,
      "steps": 4,
      "seed": 5
    })",
                                                            &spec_)
                    .ok());
    auto dataset = OpenJobDataset(spec_);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    dataset_ = std::move(*dataset);
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("fake_device_test-", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Stage> MakeStage(Device device) {
    StagePlacement p;
    p.layer_end = 5;
    p.micro_batches = 2;
    p.device = device;
    absl::StatusOr<std::unique_ptr<Stage>> stage =
        Stage::Create(spec_, p, dataset_, nullptr, nullptr);
    EXPECT_TRUE(stage.ok()) << stage.status();
    return stage.ok() ? std::move(*stage) : nullptr;
  }

  static void Train(Stage& stage, int64_t from, int64_t to) {
    for (int64_t step = from; step <= to; ++step) {
      absl::StatusOr<StageStepResult> r = stage.RunStep(step);
      ASSERT_TRUE(r.ok()) << r.status();
    }
  }

  static void ExpectSameState(Stage& a, Stage& b) {
    std::vector<NamedTensor> ta = a.model().StateTensors();
    std::vector<NamedTensor> tb = b.model().StateTensors();
    for (const NamedTensor& t : a.optimizer().State()) ta.push_back(t);
    for (const NamedTensor& t : b.optimizer().State()) tb.push_back(t);
    ASSERT_EQ(ta.size(), tb.size());
    for (size_t i = 0; i < ta.size(); ++i) {
      EXPECT_EQ(ta[i].name, tb[i].name);
      EXPECT_TRUE(BitwiseEqual(*ta[i].tensor, *tb[i].tensor)) << ta[i].name;
    }
  }

  v1::JobSpec spec_;
  std::shared_ptr<const Dataset> dataset_;
  std::filesystem::path dir_;
};

TEST_F(FakeDeviceStageTest, TrainsToTheCpuBits) {
  std::unique_ptr<Stage> cpu = MakeStage(Device::kCpu);
  std::unique_ptr<Stage> gpu = MakeStage(Device::kCuda);
  ASSERT_TRUE(cpu && gpu);
  EXPECT_EQ(gpu->model().Parameters()[0].param->value.device(), Device::kCuda);
  Train(*cpu, 1, 4);
  Train(*gpu, 1, 4);
  ExpectSameState(*cpu, *gpu);
  absl::StatusOr<LossResult> a = cpu->RunEval(Split::kTest, 0);
  absl::StatusOr<LossResult> b = gpu->RunEval(Split::kTest, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->loss_sum, b->loss_sum);
  EXPECT_EQ(a->correct, b->correct);
}

// Issue findings 1 and 2: the final write and checkpoints read device
// tensors through host copies, and restoring copies into device memory.
TEST_F(FakeDeviceStageTest,
       CheckpointsAndFinalParametersLeaveAndReachTheDevice) {
  std::unique_ptr<Stage> gpu = MakeStage(Device::kCuda);
  ASSERT_TRUE(gpu);
  Train(*gpu, 1, 2);
  const std::string path = (dir_ / "stage-0.safetensors").string();
  absl::StatusOr<WrittenCheckpoint> written =
      SaveStageCheckpoint(*gpu, 2, path);
  ASSERT_TRUE(written.ok()) << written.status();
  v1::CheckpointManifest manifest;
  manifest.set_step(2);
  v1::CheckpointFile* f = manifest.add_files();
  f->set_path("stage-0.safetensors");
  f->set_sha256(written->sha256);
  f->set_bytes(written->bytes);
  f->set_layer_end(5);
  const std::string manifest_path = (dir_ / "manifest.json").string();
  ASSERT_TRUE(storage::WriteManifest(manifest_path, manifest).ok());

  // Restored onto another device stage and onto a CPU stage, both continue
  // as the saved stage does.
  std::unique_ptr<Stage> restored = MakeStage(Device::kCuda);
  std::unique_ptr<Stage> on_cpu = MakeStage(Device::kCpu);
  ASSERT_TRUE(restored && on_cpu);
  absl::StatusOr<int64_t> step =
      RestoreStageCheckpoint(*restored, manifest_path);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 2);
  ASSERT_TRUE(RestoreStageCheckpoint(*on_cpu, manifest_path).ok());
  Train(*gpu, 3, 4);
  Train(*restored, 3, 4);
  Train(*on_cpu, 3, 4);
  ExpectSameState(*gpu, *restored);
  ExpectSameState(*gpu, *on_cpu);

  // The final parameters as the worker writes them.
  StageFileContent content = FinalParametersContent(*gpu);
  const std::string final_path = (dir_ / "model.safetensors").string();
  ASSERT_TRUE(
      WriteSafetensors(final_path, content.tensors, content.metadata).ok());
  absl::StatusOr<SafetensorsFile> read = ReadSafetensors(final_path);
  ASSERT_TRUE(read.ok()) << read.status();
  for (const NamedTensor& t : gpu->model().StateTensors()) {
    ASSERT_TRUE(read->tensors.count(t.name)) << t.name;
    EXPECT_TRUE(BitwiseEqual(read->tensors.at(t.name), *t.tensor)) << t.name;
  }
}

// Data-parallel replicas on the device: each stage's gradient nodes go to
// the host, the replicas sum them there (in memory, and over links as
// between workers), and the totals come back; the fake's kernels being the
// CPU's, two replicas end on the bits of one on the CPU. Batch norm's
// averages are held back on the host only: with replicas on the device it
// is refused by name.
TEST_F(FakeDeviceStageTest, ReplicasSumThroughTheHostToTheCpuBits) {
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.replicas = 2;
  o.dataset = dataset_;
  o.device = Device::kCuda;
  absl::StatusOr<std::unique_ptr<InProcessPipeline>> refused =
      InProcessPipeline::Create(spec_, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr("batch norm with data-parallel replicas"));

  spec_.mutable_model()->mutable_layers()->DeleteSubrange(1, 1);
  spec_.mutable_pipeline()->set_micro_batches(4);
  spec_.mutable_pipeline()->set_gradient_groups(2);
  for (bool over_links : {false, true}) {
    PipelineOptions one = o;
    one.replicas = 1;
    one.device = Device::kCpu;
    o.reduce_over_links = over_links;
    auto cpu = InProcessPipeline::Create(spec_, one);
    auto gpu = InProcessPipeline::Create(spec_, o);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    ASSERT_EQ((*gpu)->replica_count(), 2);
    EXPECT_EQ((*gpu)->stage(1, 1).model().Parameters()[0].param->value.device(),
              Device::kCuda);
    for (int s = 0; s < 4; ++s) {
      auto a = (*cpu)->Step();
      auto b = (*gpu)->Step();
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(a->loss, b->loss) << "step " << s;
      EXPECT_EQ(a->grad_norm, b->grad_norm) << "step " << s;
    }
    // Over links with one group per replica, the last backward hands its
    // gradients in as buckets, through host copies.
    if (over_links) {
      const auto* links = dynamic_cast<const LinkReduction*>(
          (*gpu)->stage(0, 0).placement().reducer);
      ASSERT_NE(links, nullptr);
      EXPECT_GT(links->buckets_summed(), 0);
    }
    const std::vector<NamedTensor> want = (*cpu)->StateTensors();
    const std::vector<NamedTensor> got = (*gpu)->StateTensors();
    ASSERT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(*want[i].tensor, *got[i].tensor))
          << (over_links ? "over links: " : "in memory: ") << want[i].name;
    }
  }
}

// Incremental decoding with its caches on the device: the CPU's scores
// (the fake's kernels are the CPU's), so every device copy and kernel of
// the decode path is there and none touches device memory from the host.
TEST(FakeDeviceTest, GenerationOnTheDeviceScoresAsOnTheCpu) {
  v1::ModelSpec spec;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(R"({
    "input": {"dtype": "INT32", "shape": {"dims": [8]}},
    "layers": [
      {"embedding": {"vocab_size": 7, "dim": 8, "max_positions": 8}},
      {"transformer_block": {"dim": 8, "heads": 2}},
      {"layer_norm": {"features": 8}},
      {"linear": {"in_features": 8, "out_features": 7}}
    ],
    "loss": {"softmax_cross_entropy": {}}
  })",
                                                          &spec)
                  .ok());
  auto cpu = Model::Build(spec, 4);
  auto gpu = Model::Build(spec, 4);
  ASSERT_TRUE(cpu.ok() && gpu.ok());
  ASSERT_TRUE((*gpu)->To(Device::kCuda).ok());
  auto a = Generator::Create(cpu->get());
  auto b = Generator::Create(gpu->get());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->Feed({1, 2, 3}), (*b)->Feed({1, 2, 3}));
  // Past the 8 positions: the window slides and the caches are rebuilt.
  for (int32_t id : {4, 5, 6, 0, 1, 2, 3}) {
    EXPECT_EQ((*a)->Feed({id}), (*b)->Feed({id}));
  }
}

}  // namespace
}  // namespace gpipe
