// Resuming replicas from memory: a stage's parked state after some steps
// reaches every replica of the stage from the lowest one that holds it, bit
// for bit; a replica that holds it keeps its own; nobody holding it, or a
// state of another step or job, is refused on every replica alike.
#include "worker/memory_resume.h"

#include <algorithm>
#include <map>
#include <thread>
#include <vector>

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/stage_checkpoint.h"
#include "services/transport/in_process_link.h"
#include "tests/support/link_mesh.h"

namespace gpipe {
namespace {

constexpr char kSpec[] = R"({
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 16}},
      {"relu": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.05, "adamw": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 64, "testSamples": 16}},
  "batchSize": 8, "steps": 10, "seed": 5
})";

class MemoryResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(
        google::protobuf::util::JsonStringToMessage(kSpec, &spec_).ok());
    auto dataset = OpenJobDataset(spec_);
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    dataset_ = std::move(*dataset);
  }
  // kSpec with batch norm after its first layer (whose running averages
  // move with every training micro-batch), over 2 micro-batches.
  void AddBatchNorm() {
    auto* layers = spec_.mutable_model()->mutable_layers();
    layers->Add()->mutable_batch_norm()->set_features(16);
    std::rotate(layers->begin() + 1, layers->end() - 1, layers->end());
    spec_.mutable_pipeline()->set_micro_batches(2);
  }
  std::unique_ptr<Stage> MakeStage() {
    StagePlacement p;
    p.layer_end = spec_.model().layers_size();
    p.micro_batches = MicroBatchCount(spec_);
    absl::StatusOr<std::unique_ptr<Stage>> stage =
        Stage::Create(spec_, p, dataset_, nullptr, nullptr);
    EXPECT_TRUE(stage.ok()) << stage.status();
    return stage.ok() ? std::move(*stage) : nullptr;
  }
  // Every tensor of the stage's checkpoint, by name.
  static std::map<std::string, Tensor> State(Stage& stage) {
    std::map<std::string, Tensor> out;
    for (const auto& [name, t] : CheckpointContent(stage, 0).tensors)
      out.emplace(name, t->Clone());
    return out;
  }
  // Runs ResumeFromMemory on `replicas` fresh stages joined by in-process
  // links, replica q holding `own[q]`; the stages and each one's result.
  std::vector<absl::StatusOr<int64_t>> Resume(
      const std::vector<const ParkedStage*>& own, int64_t step,
      std::vector<std::unique_ptr<Stage>>* stages) {
    const int64_t r = static_cast<int64_t>(own.size());
    const test_support::LinkMesh mesh(static_cast<int>(r), 64);
    const auto& peers = mesh.peers;
    for (int64_t q = 0; q < r; ++q) stages->push_back(MakeStage());
    std::vector<absl::StatusOr<int64_t>> results(r, absl::UnknownError(""));
    std::vector<std::thread> threads;
    for (int64_t q = 0; q < r; ++q) {
      threads.emplace_back([&, q] {
        results[q] = ResumeFromMemory(*(*stages)[q], spec_, q, peers[q], own[q],
                                      "job", step);
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  // Steps 0 and 1 on two stages, then step 2 whole on one and cut off
  // before its update on the other: parked and rolled forward, the state
  // is the first's bit for bit.
  void CheckRollForward();

  gpipe::v1::JobSpec spec_;
  std::shared_ptr<const Dataset> dataset_;
};

TEST_F(MemoryResumeTest, EveryReplicaGetsTheStateOfTheLowestThatHoldsIt) {
  std::unique_ptr<Stage> trained = MakeStage();
  for (int64_t s = 0; s < 3; ++s) ASSERT_TRUE(trained->RunStep(s).ok());
  const ParkedStage parked = ParkStage(*trained, spec_, "job", 3);
  const std::map<std::string, Tensor> want = State(*trained);
  // What the worker's memory check counts beside a resuming stage.
  int64_t bytes = 0;
  for (const auto& [name, t] : want) bytes += t.nbytes();
  EXPECT_EQ(ParkedBytes(parked), bytes);
  EXPECT_GT(bytes, 0);
  // A fresh stage starts elsewhere: the test would pass without a copy
  // otherwise.
  std::unique_ptr<Stage> fresh = MakeStage();
  ASSERT_FALSE(
      BitwiseEqual(State(*fresh).begin()->second, want.begin()->second));

  std::vector<std::unique_ptr<Stage>> stages;
  // Replicas 1 and 2 hold it; 1 is the source, 0 and 3 receive.
  const std::vector<absl::StatusOr<int64_t>> from =
      Resume({nullptr, &parked, &parked, nullptr}, 3, &stages);
  for (size_t q = 0; q < stages.size(); ++q) {
    ASSERT_TRUE(from[q].ok()) << "replica " << q << ": " << from[q].status();
    EXPECT_EQ(*from[q], 1);
    const std::map<std::string, Tensor> got = State(*stages[q]);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_TRUE(BitwiseEqual(got.at(name), t)) << "replica " << q << name;
    }
  }
  // Training on from there matches training on the original.
  ASSERT_TRUE(trained->RunStep(3).ok());
  ASSERT_TRUE(stages[0]->RunStep(3).ok());
  const std::map<std::string, Tensor> a = State(*trained),
                                      b = State(*stages[0]);
  for (const auto& [name, t] : a)
    EXPECT_TRUE(BitwiseEqual(t, b.at(name))) << name;
}

TEST_F(MemoryResumeTest, NobodyHoldingTheStepIsRefusedEverywhere) {
  std::unique_ptr<Stage> trained = MakeStage();
  ASSERT_TRUE(trained->RunStep(0).ok());
  const ParkedStage parked = ParkStage(*trained, spec_, "job", 1);
  ParkedStage other_job = ParkStage(*trained, spec_, "job", 1);
  other_job.job_id = "another";
  // The same job resumed with more steps holds other bits at step 1 (its
  // learning rate schedule differs).
  gpipe::v1::JobSpec longer = spec_;
  longer.set_steps(spec_.steps() * 2);
  ParkedStage other_spec = ParkStage(*trained, longer, "job", 1);
  std::vector<std::unique_ptr<Stage>> stages;
  // Held after step 1, asked for step 2; and another job's.
  const std::vector<absl::StatusOr<int64_t>> from =
      Resume({&parked, &other_job}, 2, &stages);
  for (const auto& f : from) {
    ASSERT_FALSE(f.ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(f.status())) << f.status();
    EXPECT_NE(f.status().message().find("after step 2"), std::string::npos)
        << f.status();
  }
  stages.clear();
  const std::vector<absl::StatusOr<int64_t>> changed =
      Resume({&other_spec, &other_job}, 1, &stages);
  for (const auto& f : changed) EXPECT_FALSE(f.ok()) << *f;
  // One replica alone resumes from its own state.
  stages.clear();
  const std::vector<absl::StatusOr<int64_t>> alone =
      Resume({&parked}, 1, &stages);
  ASSERT_TRUE(alone[0].ok()) << alone[0].status();
  EXPECT_EQ(*alone[0], 0);
}

// A stage cut off while its update waited for the pipeline's total (its
// gradients final) rolls forward with the total another stage reports, to
// the bits of the stage that applied the update itself.
void MemoryResumeTest::CheckRollForward() {
  std::unique_ptr<Stage> applied = MakeStage();
  std::unique_ptr<Stage> cut_off = MakeStage();
  for (int64_t s = 0; s < 2; ++s) {
    ASSERT_TRUE(applied->RunStep(s).ok());
    ASSERT_TRUE(cut_off->RunStep(s).ok());
  }
  ASSERT_TRUE(applied->RunStep(2).ok());
  ASSERT_TRUE(cut_off->BeginStep(2).ok());
  for (const Op& op :
       MakeSchedule(ScheduleKind::kGPipe, 1, MicroBatchCount(spec_), 0)) {
    if (op.kind == OpKind::kOptimizerStep) continue;
    ASSERT_TRUE(cut_off->RunOp(op).ok());
  }
  ASSERT_TRUE(cut_off->SendGradSquares().ok());
  EXPECT_EQ(cut_off->pending_update(), 2);
  EXPECT_EQ(applied->last_update_step(), 2);
  const ParkedStage parked = ParkStage(*cut_off, spec_, "job", 2);
  ASSERT_TRUE(parked.pending);
  ASSERT_FALSE(parked.grads.empty());

  std::vector<std::unique_ptr<Stage>> stages;
  // Without the total it holds nothing at step 3.
  EXPECT_FALSE(Resume({&parked}, 3, &stages)[0].ok());
  stages.clear();
  std::unique_ptr<Stage> fresh = MakeStage();
  absl::StatusOr<int64_t> from = ResumeFromMemory(
      *fresh, spec_, 0, {}, &parked, "job", 3, applied->last_update_squares());
  ASSERT_TRUE(from.ok()) << from.status();
  const std::map<std::string, Tensor> want = State(*applied),
                                      got = State(*fresh);
  for (const auto& [name, t] : want)
    EXPECT_TRUE(BitwiseEqual(t, got.at(name))) << name;
}

TEST_F(MemoryResumeTest, APendingUpdateRollsForwardToTheSameBits) {
  CheckRollForward();
}

// Batch norm's running averages move with the update, by every
// micro-batch's statistics: a stage cut off before it still holds the
// averages of the step boundary (what it parks is not torn), keeps the
// statistics with the pending gradients, and rolls forward to the bits of
// the stage that applied the update.
TEST_F(MemoryResumeTest, BatchNormAveragesMoveWithTheUpdate) {
  AddBatchNorm();
  CheckRollForward();
  std::unique_ptr<Stage> stage = MakeStage();
  ASSERT_TRUE(stage->RunStep(0).ok());
  const std::map<std::string, Tensor> boundary = State(*stage);
  ASSERT_TRUE(stage->BeginStep(1).ok());
  for (const Op& op :
       MakeSchedule(ScheduleKind::kGPipe, 1, MicroBatchCount(spec_), 0)) {
    if (op.kind == OpKind::kOptimizerStep) continue;
    ASSERT_TRUE(stage->RunOp(op).ok());
  }
  const std::map<std::string, Tensor> cut = State(*stage);
  ASSERT_TRUE(boundary.count("layers.1.running_mean") > 0);
  for (const auto& [name, t] : boundary)
    EXPECT_TRUE(BitwiseEqual(t, cut.at(name))) << name;
  ASSERT_TRUE(stage->SendGradSquares().ok());
  const ParkedStage parked = ParkStage(*stage, spec_, "job", 1);
  ASSERT_TRUE(parked.running_statistics.defined());
  EXPECT_EQ(parked.running_statistics.dim(0), MicroBatchCount(spec_));
  // Without them the update cannot run.
  std::unique_ptr<Stage> fresh = MakeStage();
  ASSERT_TRUE(LoadStageState(*fresh, parked.state, "memory").ok());
  const absl::Status refused =
      fresh->RollForward(1, stage->last_update_squares(), parked.grads);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
}

// The same cut-off as a worker sees it: stage 0 of two runs RunStep, which
// drops the step's records when its wait for the clipping total fails.
// The pending update keeps its statistics anyway, and rolls forward to the
// bits of a stage 0 that got the total.
TEST_F(MemoryResumeTest, ARunStepCutOffKeepsItsPendingStatistics) {
  AddBatchNorm();
  struct Pair {
    std::unique_ptr<Link> down, up;
    std::unique_ptr<Stage> first, last;
  };
  const auto make = [&]() {
    Pair pair;
    auto links = MakeInProcessLinkPair(64);
    pair.down = std::move(links.first);
    pair.up = std::move(links.second);
    StagePlacement p;
    p.count = 2;
    p.layer_end = 2;
    p.micro_batches = MicroBatchCount(spec_);
    auto first = Stage::Create(spec_, p, dataset_, nullptr, pair.down.get());
    p.index = 1;
    p.layer_begin = 2;
    p.layer_end = spec_.model().layers_size();
    auto last = Stage::Create(spec_, p, dataset_, pair.up.get(), nullptr);
    EXPECT_TRUE(first.ok() && last.ok());
    if (first.ok()) pair.first = std::move(*first);
    if (last.ok()) pair.last = std::move(*last);
    return pair;
  };
  Pair whole = make(), cut = make();
  ASSERT_TRUE(whole.first && whole.last && cut.first && cut.last);
  {
    absl::StatusOr<StageStepResult> a = absl::UnknownError(""),
                                    b = absl::UnknownError("");
    std::thread t([&] { a = whole.first->RunStep(0); });
    b = whole.last->RunStep(0);
    t.join();
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
  }
  absl::StatusOr<StageStepResult> cut_off = absl::UnknownError("");
  std::thread t([&] { cut_off = cut.first->RunStep(0); });
  ASSERT_TRUE(cut.last->BeginStep(0).ok());
  for (const Op& op : WithTransfers(
           MakeSchedule(ScheduleKind::kGPipe, 2, MicroBatchCount(spec_), 1),
           ScheduleKind::kGPipe, 2, 1, 1)) {
    if (op.kind != OpKind::kOptimizerStep) {
      ASSERT_TRUE(cut.last->RunOp(op).ok());
    }
  }
  ASSERT_TRUE(cut.last->SendGradSquares().ok());
  cut.up->Close();  // the total never comes back up
  t.join();
  ASSERT_FALSE(cut_off.ok());
  ASSERT_EQ(cut.first->pending_update(), 0);
  const ParkedStage parked = ParkStage(*cut.first, spec_, "job", 0);
  ASSERT_TRUE(parked.pending);
  ASSERT_TRUE(parked.running_statistics.defined());

  StagePlacement p;
  p.count = 2;
  p.layer_end = 2;
  p.micro_batches = MicroBatchCount(spec_);
  auto fresh = Stage::Create(spec_, p, dataset_, nullptr, whole.down.get());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  absl::StatusOr<int64_t> from =
      ResumeFromMemory(**fresh, spec_, 0, {}, &parked, "job", 1,
                       whole.first->last_update_squares());
  ASSERT_TRUE(from.ok()) << from.status();
  const std::map<std::string, Tensor> want = State(*whole.first),
                                      got = State(**fresh);
  ASSERT_TRUE(want.count("layers.1.running_mean") > 0);
  for (const auto& [name, t] : want)
    EXPECT_TRUE(BitwiseEqual(t, got.at(name))) << name;
}

}  // namespace
}  // namespace gpipe
