// The contract the product stands on: after N pipelined steps the parameters
// (and BatchNorm buffers) are bitwise equal to the single-process reference
// trainer that accumulates the same M micro-batches in the same order, for
// every K, M, schedule and re-materialization mode.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/status.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/link_reduction.h"
#include "services/pipeline/reference_trainer.h"
#include "tests/support/wide_mlp.h"

namespace gpipe {
namespace {

constexpr int kSteps = 3;
constexpr ScheduleKind kSchedules[] = {
    ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1,
    ScheduleKind::kInterleaved1F1B, ScheduleKind::kZeroBubbleV};

gpipe::v1::JobSpec LoadExample(const std::string& name, int64_t batch) {
  auto spec =
      LoadJobSpecFile(std::string(GPIPE_SOURCE_DIR) + "/examples/" + name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->set_batch_size(batch);
  spec->set_steps(kSteps);
  return *spec;
}

std::shared_ptr<const Dataset> Open(const gpipe::v1::JobSpec& spec) {
  auto d = OpenJobDataset(spec);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::shared_ptr<const Dataset>(std::move(*d)) : nullptr;
}

std::map<std::string, Tensor> Snapshot(Trainer& t) {
  std::map<std::string, Tensor> out;
  for (const NamedTensor& n : t.StateTensors()) out[n.name] = n.tensor->Clone();
  return out;
}

std::map<std::string, Tensor> RunReference(
    const gpipe::v1::JobSpec& spec, int64_t m,
    std::shared_ptr<const Dataset> data) {
  auto ref = ReferenceTrainer::Create(spec, m, data);
  EXPECT_TRUE(ref.ok()) << ref.status();
  for (int s = 0; s < kSteps; ++s) EXPECT_TRUE((*ref)->Step().ok());
  return Snapshot(**ref);
}

// The reference and an in-process pipeline of `stages` stages, both with `m`
// micro-batches of `data`, to step side by side.
struct SideBySide {
  std::unique_ptr<ReferenceTrainer> reference;
  std::unique_ptr<InProcessPipeline> pipeline;
};
absl::StatusOr<SideBySide> MakeSideBySide(const gpipe::v1::JobSpec& spec,
                                          int64_t stages, int64_t m,
                                          std::shared_ptr<const Dataset> data) {
  SideBySide both;
  ASSIGN_OR_RETURN(both.reference, ReferenceTrainer::Create(spec, m, data));
  PipelineOptions o;
  o.stages = stages;
  o.micro_batches = m;
  o.dataset = std::move(data);
  ASSIGN_OR_RETURN(both.pipeline, InProcessPipeline::Create(spec, o));
  return both;
}

void ExpectSame(const std::map<std::string, Tensor>& want,
                const std::map<std::string, Tensor>& got,
                const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (const auto& [name, tensor] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << ": " << name << " missing";
    EXPECT_TRUE(BitwiseEqual(tensor, it->second))
        << what << ": " << name << " differs";
  }
}

// Every K in 1..4, M in {1,2,4,8}, every schedule, all remat modes; the
// interleaved schedule and ZB-V with v = 2 chunks per worker wherever they
// apply (interleaving: M a multiple of K; K x 2 stages no more than the
// layers).
// Returns how many combinations ran with 2 chunks per worker.
int CheckSpecCombinations(const gpipe::v1::JobSpec& spec,
                          const std::string& example,
                          const std::vector<int64_t>& micro_batches) {
  std::shared_ptr<const Dataset> data = Open(spec);
  EXPECT_NE(data, nullptr);
  if (data == nullptr) return 0;
  int interleaved = 0;  // combinations run with 2 chunks per worker
  for (int64_t m : micro_batches) {
    const std::map<std::string, Tensor> want = RunReference(spec, m, data);
    for (int64_t k = 1; k <= 4; ++k) {
      for (ScheduleKind schedule : kSchedules) {
        const int64_t v = Interleaves(schedule) ? 2 : 1;
        if (!ScheduleShapeError(schedule, k, m, v).empty() ||
            k * v > spec.model().layers_size()) {
          continue;
        }
        for (RematMode remat :
             {RematMode::kAlways, RematMode::kExceptLast, RematMode::kNever}) {
          PipelineOptions o;
          o.stages = k;
          o.virtual_stages = v;
          o.micro_batches = m;
          o.schedule = schedule;
          interleaved += v > 1;
          o.remat = remat;
          o.dataset = data;
          const std::string what = example + " K=" + std::to_string(k) +
                                   " M=" + std::to_string(m) + " " +
                                   std::string(ScheduleName(schedule)) +
                                   " remat=" + std::string(RematName(remat));
          auto p = InProcessPipeline::Create(spec, o);
          EXPECT_TRUE(p.ok()) << what << ": " << p.status();
          if (!p.ok()) return interleaved;
          for (int s = 0; s < kSteps; ++s) {
            auto r = (*p)->Step();
            EXPECT_TRUE(r.ok()) << what << ": " << r.status();
            if (!r.ok()) return interleaved;
          }
          ExpectSame(want, Snapshot(**p), what);
        }
      }
    }
  }
  return interleaved;
}

void CheckAllCombinations(const std::string& example, int64_t batch) {
  const int interleaved =
      CheckSpecCombinations(LoadExample(example, batch), example, {1, 2, 4, 8});
  // K = 1 and 2 fit every example's layers twice over.
  EXPECT_GE(interleaved, 3 * 4) << example;
}

TEST(PipelineExactness, MlpAllCombinations) {
  CheckAllCombinations("fashion_mnist_mlp.json", 32);
}

TEST(PipelineExactness, CnnWithBatchNormAndDropoutAllCombinations) {
  CheckAllCombinations("fashion_mnist_cnn.json", 32);
}

TEST(PipelineExactness, TransformerWithClippingAllCombinations) {
  CheckAllCombinations("char_transformer.json", 16);
}

// Stages that group their micro-batches' weight halves: after whole
// backwards without re-materialization, and consecutive weight halves of
// split ones.
TEST(PipelineExactness, GroupedWeightHalvesAllCombinations) {
  CheckSpecCombinations(test_support::WideMlp(), "wide-mlp", {2, 8});
}

// The grouping happens: a 1F1B stage without re-materialization records
// its whole backwards' weight halves as weight-half ops, one a micro-batch,
// each after its backward.
// Only a group of all of a gradient group's micro-batches (here the
// step's): at batch 512 a group takes 4 of the 8, and groups ending
// mid-step made the stages wait on each other's products
// (WholeBackwardsGroupSize).
TEST(PipelineExactness, WholeBackwardsGroupTheirWeightHalves) {
  for (const ScheduleKind schedule :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    for (const RematMode remat : {RematMode::kNever, RematMode::kAlways}) {
      for (const int64_t batch : {32, 512}) {
        PipelineOptions o;
        o.stages = 2;
        o.micro_batches = 8;
        o.schedule = schedule;
        o.remat = remat;
        auto p = InProcessPipeline::Create(test_support::WideMlp(batch), o);
        ASSERT_TRUE(p.ok()) << p.status();
        ASSERT_TRUE((*p)->Step().ok());
        for (int64_t s = 0; s < 2; ++s) {
          int64_t weights = 0;
          for (const OpRecord& op : (*p)->stage(s).timeline().LastStep().ops)
            weights += op.phase == Phase::kBackwardWeight;
          EXPECT_EQ(weights, remat == RematMode::kNever && batch == 32 ? 8 : 0)
              << ScheduleName(schedule) << " stage " << s << " remat "
              << RematName(remat) << " batch " << batch;
        }
      }
    }
  }
}

TEST(PipelineExactness, UnevenMicroBatchesAndUnevenStages) {
  // 30 rows into M=4 (8, 8, 7, 7) and M=8; layers split 1 + 3 + 1.
  gpipe::v1::JobSpec spec = LoadExample("fashion_mnist_mlp.json", 30);
  spec.mutable_optimizer()->set_clip_norm(0.05f);  // clipping active
  std::shared_ptr<const Dataset> data = Open(spec);
  ASSERT_NE(data, nullptr);
  for (int64_t m : {4, 8}) {
    const auto want = RunReference(spec, m, data);
    for (ScheduleKind schedule : kSchedules) {
      PipelineOptions o;
      o.stages = 3;
      o.micro_batches = m;
      o.schedule = schedule;
      o.remat = RematMode::kAlways;
      o.balance = {1, 3, 1};
      if (Interleaves(schedule)) {
        // 2 workers holding 2 uneven chunks each.
        o.stages = 2;
        o.virtual_stages = 2;
        o.balance = {1, 2, 1, 1};
      }
      o.dataset = data;
      auto p = InProcessPipeline::Create(spec, o);
      ASSERT_TRUE(p.ok()) << p.status();
      for (int s = 0; s < kSteps; ++s) ASSERT_TRUE((*p)->Step().ok());
      ExpectSame(want, Snapshot(**p),
                 std::string(ScheduleName(schedule)) +
                     " uneven M=" + std::to_string(m));
    }
  }
}

// Trains `example` for kSteps on K=2 stages of `micro_batches`: the
// parameters it ends with.
std::map<std::string, Tensor> TrainTwoStages(
    const gpipe::v1::JobSpec& spec, std::shared_ptr<const Dataset> data,
    int64_t micro_batches) {
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = micro_batches;
  o.dataset = std::move(data);
  auto p = InProcessPipeline::Create(spec, o);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return {};
  for (int s = 0; s < kSteps; ++s) EXPECT_TRUE((*p)->Step().ok());
  return Snapshot(**p);
}

TEST(PipelineExactness, TheComparisonSeesADifferentMicroBatchCount) {
  // Guards the tests above against comparing nothing: with batch norm, whose
  // statistics are a micro-batch's, M=4 against the reference with M=1 must
  // differ in some bits.
  const gpipe::v1::JobSpec spec = LoadExample("fashion_mnist_cnn.json", 32);
  std::shared_ptr<const Dataset> data = Open(spec);
  const auto want = RunReference(spec, 1, data);
  const auto got = TrainTwoStages(spec, data, 4);
  ASSERT_FALSE(got.empty());
  int differing = 0;
  for (const auto& [name, t] : want)
    differing += !BitwiseEqual(t, got.at(name));
  EXPECT_GT(differing, 0);
}

TEST(PipelineExactness, AnMlpLearnsTheSameBitsWhateverTheMicroBatchCount) {
  // Each weight gradient is one chain of fused multiply-adds over the
  // batch's rows (cpu/gemm.h); a micro-batch's product picks the chain up
  // where the previous one left it (beta = 1), so splitting the batch
  // changes no bit of a model without batch statistics.
  const gpipe::v1::JobSpec spec = LoadExample("fashion_mnist_mlp.json", 32);
  std::shared_ptr<const Dataset> data = Open(spec);
  const auto want = RunReference(spec, 1, data);
  for (int64_t m : {2, 4, 8}) {
    const auto got = TrainTwoStages(spec, data, m);
    ASSERT_FALSE(got.empty());
    for (const auto& [name, t] : want)
      EXPECT_TRUE(BitwiseEqual(t, got.at(name))) << name << " at M=" << m;
  }
}

// Runs kSteps of `ops` (hand-made lists, one a stage) on K stages of
// 4 micro-batches under `schedule`: the first error, or OK with the
// parameters bitwise `want`.
absl::Status RunHandMade(const gpipe::v1::JobSpec& spec,
                         std::shared_ptr<const Dataset> data,
                         const std::map<std::string, Tensor>& want,
                         ScheduleKind schedule,
                         std::vector<std::vector<Op>> ops) {
  PipelineOptions o;
  o.stages = static_cast<int64_t>(ops.size());
  o.micro_batches = 4;
  o.schedule = schedule;
  o.dataset = std::move(data);
  o.ops = std::move(ops);
  auto p = InProcessPipeline::Create(spec, o);
  if (!p.ok()) return p.status();
  for (int s = 0; s < kSteps; ++s) {
    auto r = (*p)->Step();
    if (!r.ok()) return r.status();
  }
  ExpectSame(
      want, Snapshot(**p),
      absl::StrCat("hand-made ", std::string(ScheduleName(schedule)), " ops"));
  return absl::OkStatus();
}

// The exactness promise does not rest on the schedules being right: a
// schedule that drops a weight half (its gradient left out) or doubles one
// (added twice) stops the step with an error naming it, before any
// parameter changes; the same ops intact match the reference bit for bit.
// (The schedules' property tests and the simulator catch them before any
// run.)
TEST(PipelineExactness, ABrokenSplitScheduleIsCaught) {
  const gpipe::v1::JobSpec spec = LoadExample("fashion_mnist_mlp.json", 32);
  std::shared_ptr<const Dataset> data = Open(spec);
  const auto want = RunReference(spec, 4, data);
  const auto run = [&](std::vector<std::vector<Op>> ops) {
    return RunHandMade(spec, data, want, ScheduleKind::kZeroBubbleH1,
                       std::move(ops));
  };
  std::vector<std::vector<Op>> intact;
  for (int64_t s = 0; s < 2; ++s)
    intact.push_back(MakeSchedule(ScheduleKind::kZeroBubbleH1, 2, 4, s));
  EXPECT_TRUE(run(intact).ok());
  const auto weight_of = [](std::vector<Op>& ops, int64_t m) {
    return std::find(ops.begin(), ops.end(), Op{OpKind::kBackwardWeight, m});
  };
  std::vector<std::vector<Op>> dropped = intact;
  dropped[1].erase(weight_of(dropped[1], 2));
  const absl::Status d = run(dropped);
  EXPECT_EQ(d.code(), absl::StatusCode::kFailedPrecondition) << d;
  EXPECT_NE(d.message().find("never runs W2"), std::string::npos) << d;
  std::vector<std::vector<Op>> doubled = intact;
  doubled[0].insert(weight_of(doubled[0], 1) + 1,
                    Op{OpKind::kBackwardWeight, 1});
  const absl::Status w = run(doubled);
  EXPECT_EQ(w.code(), absl::StatusCode::kFailedPrecondition) << w;
  EXPECT_NE(w.message().find("runs W1"), std::string::npos) << w;
  // An input half run twice, or one without its forward, is refused too.
  std::vector<std::vector<Op>> twice = intact;
  auto b1 = std::find(twice[1].begin(), twice[1].end(),
                      Op{OpKind::kBackwardInput, 1});
  twice[1].insert(b1 + 1, Op{OpKind::kBackwardInput, 1});
  const absl::Status t = run(twice);
  EXPECT_EQ(t.code(), absl::StatusCode::kFailedPrecondition) << t;
  EXPECT_NE(t.message().find("without its forward"), std::string::npos) << t;
  // A backward never run leaves its gradient out: refused at the step.
  std::vector<std::vector<Op>> skipped(2);
  for (int64_t s = 0; s < 2; ++s) {
    skipped[s] = MakeSchedule(ScheduleKind::kOneFOneB, 2, 4, s);
  }
  skipped[0].erase(std::find(skipped[0].begin(), skipped[0].end(),
                             Op{OpKind::kBackward, 3}));
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.schedule = ScheduleKind::kOneFOneB;
  o.dataset = data;
  o.ops = skipped;
  auto p = InProcessPipeline::Create(spec, o);
  ASSERT_TRUE(p.ok()) << p.status();
  const absl::Status never = (*p)->Step().status();
  EXPECT_EQ(never.code(), absl::StatusCode::kFailedPrecondition) << never;
  EXPECT_NE(never.message().find("never runs the backward of micro-batch 3"),
            std::string::npos)
      << never;
}

// The transfers are the schedule's actions too: hand-made lists that spell
// them out run bitwise as the built-in ones, and one that forwards without
// receiving, sends what it has not made, or receives what it never uses is
// stopped with an error naming the action. (A send left out would leave
// its neighbour waiting: Simulate catches that, before any run, in lists
// checked with it.)
TEST(PipelineExactness, ScheduleTransfersAreCheckedActions) {
  const gpipe::v1::JobSpec spec = LoadExample("fashion_mnist_mlp.json", 32);
  std::shared_ptr<const Dataset> data = Open(spec);
  const auto want = RunReference(spec, 4, data);
  const auto run = [&](std::vector<std::vector<Op>> ops) {
    return RunHandMade(spec, data, want, ScheduleKind::kOneFOneB,
                       std::move(ops));
  };
  std::vector<std::vector<Op>> intact;
  for (int64_t s = 0; s < 3; ++s) {
    intact.push_back(
        WithTransfers(MakeSchedule(ScheduleKind::kOneFOneB, 3, 4, s),
                      ScheduleKind::kOneFOneB, 3, 1, s));
  }
  EXPECT_TRUE(run(intact).ok());
  const auto at = [](std::vector<Op>& ops, OpKind kind, int64_t m) {
    auto it = std::find(ops.begin(), ops.end(), Op{kind, m});
    EXPECT_TRUE(it != ops.end()) << ToString(Op{kind, m});
    return it;
  };
  const auto fails_with = [&](std::vector<std::vector<Op>> ops,
                              absl::string_view what) {
    const absl::Status st = run(std::move(ops));
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find(what), std::string::npos) << st;
  };
  // Stage 1 forwards micro-batch 2 without its receive, or sends micro-batch
  // 1's input gradient before the backward that makes it.
  std::vector<std::vector<Op>> unreceived = intact;
  unreceived[1].erase(at(unreceived[1], OpKind::kReceiveActivation, 2));
  fails_with(unreceived, "runs F2 before receiving its activation (ra2)");
  std::vector<std::vector<Op>> early = intact;
  early[1].erase(at(early[1], OpKind::kSendGradient, 1));
  early[1].insert(at(early[1], OpKind::kBackward, 1),
                  Op{OpKind::kSendGradient, 1});
  fails_with(early, "sends micro-batch 1's input gradient before its backward");
  // Stage 0 receives micro-batch 3's gradient and drops its backward.
  std::vector<std::vector<Op>> unused = intact;
  unused[0].erase(at(unused[0], OpKind::kBackward, 3));
  fails_with(unused, "received the gradient of micro-batch 3 and did not use");
  // A stage with no upstream receives no activation.
  std::vector<std::vector<Op>> no_link = intact;
  no_link[0].insert(no_link[0].begin(), Op{OpKind::kReceiveActivation, 0});
  fails_with(no_link, "with no upstream stage");
}

// Grouped weight halves keep the backwards' order whatever a hand-made
// schedule does around them: sends after all the backwards (the group
// waits for a send that comes late), and whole backwards mixed with split
// ones on the stage that groups.
TEST(PipelineExactness, GroupedWeightHalvesKeepTheOrderOfHandMadeSchedules) {
  const gpipe::v1::JobSpec spec = test_support::WideMlp();
  std::shared_ptr<const Dataset> data = Open(spec);
  const auto want = RunReference(spec, 4, data);
  std::vector<std::vector<Op>> intact;
  for (int64_t s = 0; s < 2; ++s) {
    intact.push_back(WithTransfers(MakeSchedule(ScheduleKind::kGPipe, 2, 4, s),
                                   ScheduleKind::kGPipe, 2, 1, s));
  }
  ASSERT_TRUE(RunHandMade(spec, data, want, ScheduleKind::kGPipe, intact).ok());
  // Stage 1 (which groups: the last stage does not re-materialize) sends
  // its input gradients only after its last backward.
  std::vector<std::vector<Op>> late = intact;
  std::vector<Op>& ops = late[1];
  ops.erase(std::remove_if(
                ops.begin(), ops.end(),
                [](const Op& op) { return op.kind == OpKind::kSendGradient; }),
            ops.end());
  auto step = std::find(ops.begin(), ops.end(), Op{OpKind::kOptimizerStep, -1});
  ASSERT_TRUE(step != ops.end());
  for (int64_t m = 0; m < 4; ++m)
    step = ops.insert(step, Op{OpKind::kSendGradient, m}) + 1;
  absl::Status st = RunHandMade(spec, data, want, ScheduleKind::kGPipe, late);
  EXPECT_TRUE(st.ok()) << st;
  // Micro-batch 1's backward split in two halves between whole ones.
  std::vector<std::vector<Op>> mixed = intact;
  auto b1 =
      std::find(mixed[1].begin(), mixed[1].end(), Op{OpKind::kBackward, 1});
  ASSERT_TRUE(b1 != mixed[1].end());
  *b1 = Op{OpKind::kBackwardInput, 1};
  mixed[1].insert(b1 + 1, Op{OpKind::kBackwardWeight, 1});
  st = RunHandMade(spec, data, want, ScheduleKind::kGPipe, mixed);
  EXPECT_TRUE(st.ok()) << st;
}

// With several gradient groups on a stage, a weight gradient out of
// micro-batch order would land in the wrong group: refused, not summed.
TEST(PipelineExactness, WeightGradientsOutOfOrderAcrossGroupsAreRefused) {
  gpipe::v1::JobSpec spec = LoadExample("fashion_mnist_mlp.json", 32);
  spec.mutable_pipeline()->set_micro_batches(4);
  spec.mutable_pipeline()->set_gradient_groups(2);
  std::shared_ptr<const Dataset> data = Open(spec);
  std::vector<Op> ops = MakeSchedule(ScheduleKind::kGPipe, 1, 4, 0);
  auto b0 = std::find(ops.begin(), ops.end(), Op{OpKind::kBackward, 0});
  auto b1 = std::find(ops.begin(), ops.end(), Op{OpKind::kBackward, 1});
  ASSERT_TRUE(b0 != ops.end() && b1 != ops.end());
  std::iter_swap(b0, b1);
  PipelineOptions o;
  o.stages = 1;
  o.micro_batches = 4;
  o.dataset = data;
  o.ops = {ops};
  auto p = InProcessPipeline::Create(spec, o);
  ASSERT_TRUE(p.ok()) << p.status();
  const absl::Status s = (*p)->Step().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(
      s.message().find("micro-batch 1 came where micro-batch 0's was due"),
      std::string::npos)
      << s;
}

TEST(PipelineExactness, TheGradientNormIsSummedOnlyWhenClipping) {
  // A job that clips reports its global norm, the same bits on both sides;
  // one that does not sums no squares (a pass over every gradient nothing
  // would read), reports 0, and its stages' exchange carries 0.
  for (const float clip : {1.0f, 0.0f}) {
    gpipe::v1::JobSpec spec = LoadExample("fashion_mnist_mlp.json", 32);
    spec.mutable_optimizer()->set_clip_norm(clip);
    std::shared_ptr<const Dataset> data = Open(spec);
    ASSERT_NE(data, nullptr);
    auto both = MakeSideBySide(spec, 2, 4, data);
    ASSERT_TRUE(both.ok()) << both.status();
    for (int s = 0; s < 2; ++s) {
      auto a = both->reference->Step();
      auto b = both->pipeline->Step();
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(a->grad_norm, b->grad_norm) << "clip " << clip;
      if (clip > 0) {
        EXPECT_GT(a->grad_norm, 0.0);
      } else {
        EXPECT_EQ(a->grad_norm, 0.0);
      }
    }
  }
}

TEST(PipelineExactness, LossAndEvaluationMatchTheReference) {
  const gpipe::v1::JobSpec spec = LoadExample("char_transformer.json", 16);
  std::shared_ptr<const Dataset> data = Open(spec);
  auto both = MakeSideBySide(spec, 3, 4, data);
  ASSERT_TRUE(both.ok()) << both.status();
  ReferenceTrainer& ref = *both->reference;
  InProcessPipeline& p = *both->pipeline;
  for (int s = 0; s < kSteps; ++s) {
    auto a = ref.Step();
    auto b = p.Step();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->loss, b->loss);
    EXPECT_EQ(a->grad_norm, b->grad_norm);
    EXPECT_EQ(a->lr, b->lr);
  }
  auto ea = ref.Evaluate(Split::kTest, 200);
  auto eb = p.Evaluate(Split::kTest, 200);
  ASSERT_TRUE(ea.ok() && eb.ok()) << eb.status();
  EXPECT_EQ(ea->counted, eb->counted);
  EXPECT_EQ(ea->loss, eb->loss);
  EXPECT_EQ(ea->accuracy, eb->accuracy);
}

// Data-parallel replicas: with the gradient groups pinned (G = 4), every K,
// R = 1, 2, 4 and 3 (which shares the groups 1, 1, 2), GPipe and 1F1B
// (ZB-H1 where each replica holds one group) and every remat mode end
// bitwise equal to the reference trainer summing the same groups; so do
// the step's reported losses.
void CheckReplicas(gpipe::v1::JobSpec spec, bool every_remat,
                   bool over_links = false) {
  std::shared_ptr<const Dataset> data = Open(spec);
  ASSERT_NE(data, nullptr);
  spec.mutable_pipeline()->set_gradient_groups(4);
  for (int64_t m : {4, 8}) {
    auto ref = ReferenceTrainer::Create(spec, m, data);
    ASSERT_TRUE(ref.ok()) << ref.status();
    std::vector<double> losses;
    for (int s = 0; s < kSteps; ++s) {
      auto r = (*ref)->Step();
      ASSERT_TRUE(r.ok()) << r.status();
      losses.push_back(r->loss);
    }
    const std::map<std::string, Tensor> want = Snapshot(**ref);
    for (int64_t k = 1; k <= 3; ++k) {
      for (int64_t replicas : {1, 2, 3, 4}) {
        for (ScheduleKind schedule :
             {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
              ScheduleKind::kZeroBubbleH1}) {
          if (SplitsBackward(schedule) && replicas != 4) continue;
          for (RematMode remat : {RematMode::kExceptLast, RematMode::kAlways,
                                  RematMode::kNever}) {
            if (!every_remat && remat != RematMode::kExceptLast) continue;
            PipelineOptions o;
            o.stages = k;
            o.micro_batches = m;
            o.replicas = replicas;
            o.schedule = schedule;
            o.remat = remat;
            o.dataset = data;
            o.reduce_over_links = over_links;
            const std::string what = (over_links ? "links " : "") +
                                     spec.name() + " K=" + std::to_string(k) +
                                     " R=" + std::to_string(replicas) +
                                     " M=" + std::to_string(m) + " " +
                                     std::string(ScheduleName(schedule)) +
                                     " remat=" + std::string(RematName(remat));
            auto p = InProcessPipeline::Create(spec, o);
            ASSERT_TRUE(p.ok()) << what << ": " << p.status();
            ASSERT_EQ((*p)->replica_count(), replicas) << what;
            for (int s = 0; s < kSteps; ++s) {
              auto r = (*p)->Step();
              ASSERT_TRUE(r.ok()) << what << ": " << r.status();
              EXPECT_EQ(r->loss, losses[s]) << what << " step " << s;
            }
            ExpectSame(want, Snapshot(**p), what);
            // Over links with one group per replica, each stage's last
            // backward hands its gradients in as buckets (the overlap);
            // with more on any replica, the forests go whole after the
            // last backward.
            if (over_links && replicas > 1) {
              const auto* links = dynamic_cast<const LinkReduction*>(
                  (*p)->stage(0, 0).placement().reducer);
              ASSERT_NE(links, nullptr) << what;
              EXPECT_EQ(links->buckets_summed() > 0, replicas == 4) << what;
            }
            // Every replica holds the same parameters, not only replica 0.
            for (int64_t r = 1; r < replicas; ++r) {
              for (int64_t i = 0; i < k; ++i) {
                const auto mine = (*p)->stage(i, r).model().StateTensors();
                const auto first = (*p)->stage(i, 0).model().StateTensors();
                for (size_t t = 0; t < mine.size(); ++t) {
                  EXPECT_TRUE(BitwiseEqual(*mine[t].tensor, *first[t].tensor))
                      << what << ": replica " << r << " " << mine[t].name;
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST(ReplicaExactness, MlpEveryKReplicasScheduleAndRemat) {
  CheckReplicas(LoadExample("fashion_mnist_mlp.json", 32), true);
}

// The same over links between the replicas (LinkReduction), as between
// worker processes.
TEST(ReplicaExactness, MlpOverLinks) {
  CheckReplicas(LoadExample("fashion_mnist_mlp.json", 32), false, true);
}

TEST(ReplicaExactness, TransformerOverLinks) {
  CheckReplicas(LoadExample("char_transformer.json", 16), false, true);
}

// Grouped weight halves, with the last group's gradients handed to the
// links in buckets as its layers finish them.
TEST(ReplicaExactness, GroupedWeightHalvesOverLinks) {
  gpipe::v1::JobSpec spec = test_support::WideMlp();
  spec.mutable_pipeline()->set_micro_batches(8);
  spec.mutable_pipeline()->set_gradient_groups(4);
  std::shared_ptr<const Dataset> data = Open(spec);
  ASSERT_NE(data, nullptr);
  const std::map<std::string, Tensor> want = RunReference(spec, 8, data);
  for (ScheduleKind schedule :
       {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1}) {
    const std::string what = std::string(ScheduleName(schedule));
    PipelineOptions o;
    o.stages = 2;
    o.micro_batches = 8;
    o.replicas = 4;
    o.schedule = schedule;
    o.remat = RematMode::kNever;
    o.dataset = data;
    o.reduce_over_links = true;
    auto p = InProcessPipeline::Create(spec, o);
    ASSERT_TRUE(p.ok()) << what << ": " << p.status();
    for (int s = 0; s < kSteps; ++s) {
      auto r = (*p)->Step();
      ASSERT_TRUE(r.ok()) << what << ": " << r.status();
    }
    ExpectSame(want, Snapshot(**p), what);
    const auto* links = dynamic_cast<const LinkReduction*>(
        (*p)->stage(0, 0).placement().reducer);
    ASSERT_NE(links, nullptr) << what;
    EXPECT_GT(links->buckets_summed(), 0) << what;
  }
}

TEST(ReplicaExactness, MlpWithDropout) {
  gpipe::v1::JobSpec spec = LoadExample("fashion_mnist_mlp.json", 32);
  // Dropout after the first layer: its masks follow the micro-batch's
  // index in the step, whichever replica runs it.
  auto* layers = spec.mutable_model()->mutable_layers();
  layers->Add()->mutable_dropout()->set_p(0.25f);
  std::rotate(layers->begin() + 1, layers->end() - 1, layers->end());
  CheckReplicas(spec, false);
}

// Batch norm's running averages follow every micro-batch in order: each
// replica holds back its micro-batches' statistics, the replicas gather
// them after the sum, and every replica moves its averages by all of them
// in micro-batch order (RunningStatistics). The snapshot holds the
// averages, and the evaluation after the steps reads them.
TEST(ReplicaExactness, CnnWithBatchNorm) {
  CheckReplicas(LoadExample("fashion_mnist_cnn.json", 32), false);
}

TEST(ReplicaExactness, CnnWithBatchNormOverLinks) {
  CheckReplicas(LoadExample("fashion_mnist_cnn.json", 32), false, true);
}

TEST(ReplicaExactness, TransformerWithClipping) {
  CheckReplicas(LoadExample("char_transformer.json", 16), false);
}

// The tree is really there: four groups sum differently from one sequence
// (so the tests above could not pass by accident of a sequential sum).
TEST(ReplicaExactness, GroupsChangeTheOrderOfTheSum) {
  gpipe::v1::JobSpec spec = LoadExample("fashion_mnist_mlp.json", 32);
  std::shared_ptr<const Dataset> data = Open(spec);
  ASSERT_NE(data, nullptr);
  const std::map<std::string, Tensor> sequential = RunReference(spec, 8, data);
  spec.mutable_pipeline()->set_gradient_groups(4);
  const std::map<std::string, Tensor> tree = RunReference(spec, 8, data);
  int differ = 0;
  for (const auto& [name, t] : sequential)
    differ += !BitwiseEqual(t, tree.at(name));
  EXPECT_GT(differ, 0);
}

TEST(ReplicaExactness, RefusesWhatItCannotRunExactly) {
  gpipe::v1::JobSpec spec = LoadExample("fashion_mnist_mlp.json", 32);
  std::shared_ptr<const Dataset> data = Open(spec);
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.dataset = data;
  o.replicas = 3;  // G defaults to R = 3, which does not divide M = 4
  auto p = InProcessPipeline::Create(spec, o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("do not divide micro_batches"),
            std::string::npos)
      << p.status();
  o.replicas = 2;
  o.schedule = ScheduleKind::kInterleaved1F1B;
  o.virtual_stages = 2;
  p = InProcessPipeline::Create(spec, o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("INTERLEAVED_1F1B"), std::string::npos)
      << p.status();
}

}  // namespace
}  // namespace gpipe
