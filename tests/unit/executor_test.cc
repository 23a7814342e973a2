// The worker's executor without a network: three executors in this process,
// joined by in-process links through an injected DownstreamConnector, run a
// job's stages from the assignment to the final parameters. The result is
// bitwise the reference trainer's; checkpoints land where the checkpoint
// layout says, on the steps the step plan says; a checkpoint restores and
// the replay ends bitwise equal; a cancel of one stage stops its neighbours.
#include "worker/executor.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "controller/recovery.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "services/core/status.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/partitioner.h"
#include "services/pipeline/reference_trainer.h"
#include "services/pipeline/step_plan.h"
#include "services/storage/checkpoint_layout.h"
#include "services/storage/safetensors.h"
#include "services/telemetry/stage_metrics.h"
#include "services/transport/in_process_link.h"
#include "tests/support/worker_reports.h"

namespace gpipe {
namespace {

constexpr int kStages = 3;
constexpr int kMicroBatches = 4;

constexpr char kSpec[] = R"json({
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 16}},
      {"relu": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 16}},
      {"tanh": {}},
      {"linear": {"inFeatures": 16, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.05, "sgd": {"momentum": 0.9}},
  "data": {"synthetic": {"task": "CLASSES", "features": 8,
                         "classes": 3, "trainSamples": 240,
                         "testSamples": 60}},
  "checkpoint": {"every": 2},
  "eval": {"every": 3},
  "batchSize": 24, "steps": 7, "seed": 11
})json";

using Reports = test_support::WorkerReports;

// The receiving end of a link whose first evaluation batch arrives with
// a tensor of the wrong shape, as a faulty neighbour would send it.
class BadFirstEvalBatch final : public Link {
 public:
  explicit BadFirstEvalBatch(std::shared_ptr<Link> inner)
      : inner_(std::move(inner)) {}
  absl::Status Send(Message m) override { return inner_->Send(std::move(m)); }
  absl::StatusOr<Message> Receive() override {
    absl::StatusOr<Message> m = inner_->Receive();
    if (m.ok() && m->kind == MessageKind::kActivation && m->step == kEvalStep &&
        m->micro_batch == 0) {
      m->tensor = Tensor::Zeros(Shape({1, 1}), DType::kF32);
    }
    return m;
  }
  void Close() override { inner_->Close(); }
  void Release() override { inner_->Release(); }
  int64_t bytes_sent() const override { return inner_->bytes_sent(); }
  int64_t bytes_received() const override { return inner_->bytes_received(); }

 private:
  std::shared_ptr<Link> inner_;
};

// Hands the far end of a fresh in-process link pair to the executor that
// runs the assignment's next stage (`next`), as its Exchange handler would;
// into stage `bad_eval_into`, through BadFirstEvalBatch.
class InProcessConnector final : public DownstreamConnector {
 public:
  explicit InProcessConnector(
      std::function<Executor*(const gpipe::v1::Assignment&)> next,
      const int64_t* bad_eval_into = nullptr)
      : next_(std::move(next)), bad_eval_into_(bad_eval_into) {}
  absl::StatusOr<std::unique_ptr<Link>> Connect(
      const gpipe::v1::Assignment& a, int64_t,
      const std::function<bool()>& cancelled) override {
    auto [mine, theirs] = MakeInProcessLinkPair(a.micro_batches() + 4);
    std::shared_ptr<Link> into = std::move(theirs);
    if (bad_eval_into_ != nullptr && *bad_eval_into_ == a.stage() + 1) {
      into = std::make_shared<BadFirstEvalBatch>(std::move(into));
    }
    RETURN_IF_ERROR(next_(a)->AcceptUpstream(a.job_id(), a.epoch(), a.stage(),
                                             a.replica(), std::move(into),
                                             /*wait_ms=*/5000));
    return std::move(mine);
  }
  // These executors form one replica; worker_test runs replicas over gRPC.
  absl::StatusOr<std::unique_ptr<Link>> ConnectReplica(
      const gpipe::v1::Assignment&, int64_t, int64_t,
      const std::function<bool()>&) override {
    return absl::UnimplementedError("one replica in this test");
  }
  absl::StatusOr<AgreedPlane> AwaitDataPlane(
      Link&, const gpipe::v1::Assignment&,
      const std::function<bool()>&) override {
    return AgreedPlane{"in_process", ""};
  }

 private:
  std::function<Executor*(const gpipe::v1::Assignment&)> next_;
  const int64_t* const bad_eval_into_;
};

class ExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<gpipe::v1::JobSpec> spec = ParseJobSpecJson(kSpec);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    dir_ = std::filesystem::temp_directory_path() /
           ("gpipe-executor-test-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    for (int i = 0; i < kStages; ++i) {
      executors_[i] = std::make_unique<Executor>(
          1, [this](const gpipe::v1::WorkerMessage& m) { reports_.Add(m); });
    }
    for (int i = 0; i < kStages; ++i) {
      next_[i] = i + 1 < kStages ? executors_[i + 1].get() : nullptr;
      executors_[i]->set_downstream_connector(
          std::make_unique<InProcessConnector>(
              [next = &next_[i]](const gpipe::v1::Assignment&) {
                return *next;
              },
              &bad_eval_into_));
    }
  }
  void TearDown() override {
    for (auto& e : executors_) e.reset();
    std::filesystem::remove_all(dir_);
  }

  gpipe::v1::Assignment Assign(int64_t stage, int64_t epoch,
                               int64_t start_step = 0,
                               const std::string& restore = "") {
    const std::vector<int64_t> balance = *PartitionJob(spec_, kStages);
    const std::vector<int64_t> begins = StageBegins(balance);
    const std::string job_dir = storage::JobCheckpointDir(dir_.string(), "j");
    gpipe::v1::Assignment a;
    a.set_job_id("j");
    a.set_epoch(epoch);
    *a.mutable_spec() = spec_;
    a.set_stage(stage);
    a.set_stages(kStages);
    a.set_layer_begin(begins[stage]);
    a.set_layer_end(begins[stage] + balance[stage]);
    a.set_micro_batches(kMicroBatches);
    a.set_schedule(gpipe::v1::ONE_F_ONE_B);
    a.set_remat(gpipe::v1::ALWAYS);
    a.set_checkpoint_dir(job_dir);
    a.set_output_dir(storage::FinalParametersDir(job_dir));
    a.set_start_step(start_step);
    a.set_restore_manifest(restore);
    return a;
  }

  void StartAll(int64_t epoch, int64_t start_step = 0,
                const std::string& restore = "") {
    // The last stage first, as the controller's assignments may arrive.
    for (int i = kStages - 1; i >= 0; --i) {
      executors_[i]->Start(Assign(i, epoch, start_step, restore));
    }
  }

  // The finished stages' parameters, by tensor name.
  std::map<std::string, Tensor> FinalParameters() {
    std::map<std::string, Tensor> got;
    for (const auto& m : reports_.All()) {
      if (!m.has_finished()) continue;
      absl::StatusOr<SafetensorsFile> file =
          ReadSafetensors(m.finished().parameters_path());
      EXPECT_TRUE(file.ok()) << file.status();
      if (!file.ok()) continue;
      for (auto& [name, t] : file->tensors) got[name] = t;
    }
    return got;
  }

  void ExpectReferenceParameters() {
    auto ref = ReferenceTrainer::Create(spec_, kMicroBatches);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (int s = 0; s < spec_.steps(); ++s) ASSERT_TRUE((*ref)->Step().ok());
    std::map<std::string, Tensor> got = FinalParameters();
    int compared = 0;
    for (const NamedTensor& t : (*ref)->StateTensors()) {
      ASSERT_TRUE(got.count(t.name)) << t.name;
      EXPECT_TRUE(BitwiseEqual(*t.tensor, got[t.name])) << t.name;
      ++compared;
    }
    EXPECT_EQ(compared, static_cast<int>(got.size()));
  }

  // Stage `stage` of spec_ cut into 4 chunks for 2 workers (interleaved
  // 1F1B, 2 virtual stages), without its spec.
  gpipe::v1::Assignment InterleavedChunk(int64_t stage) {
    const std::vector<int64_t> balance = *PartitionJob(spec_, 4);
    const std::vector<int64_t> begins = StageBegins(balance);
    gpipe::v1::Assignment a = Assign(0, /*epoch=*/1);
    a.clear_spec();
    a.set_stage(stage);
    a.set_stages(4);
    a.set_layer_begin(begins[stage]);
    a.set_layer_end(begins[stage] + balance[stage]);
    a.set_schedule(gpipe::v1::INTERLEAVED_1F1B);
    return a;
  }
  // Two workers running spec_'s 4 chunks interleaved, worker w stages w
  // and w + 2 (stage s + 1 on worker (s + 1) % 2: the last worker's links
  // go back to the first), started.
  std::vector<std::unique_ptr<Executor>> StartInterleaved() {
    spec_.mutable_pipeline()->set_schedule(gpipe::v1::INTERLEAVED_1F1B);
    spec_.mutable_pipeline()->set_virtual_stages(2);
    auto workers = std::make_shared<std::vector<Executor*>>(2);
    std::vector<std::unique_ptr<Executor>> owned;
    for (int w = 0; w < 2; ++w) {
      owned.push_back(std::make_unique<Executor>(
          1, [this](const gpipe::v1::WorkerMessage& m) { reports_.Add(m); }));
      (*workers)[w] = owned.back().get();
      owned.back()->set_downstream_connector(
          std::make_unique<InProcessConnector>(
              [workers](const gpipe::v1::Assignment& a) {
                return (*workers)[(a.stage() + 1) % 2];
              },
              &bad_eval_into_));
    }
    for (int w = 1; w >= 0; --w) {
      gpipe::v1::Assignment a = InterleavedChunk(w);
      *a.mutable_spec() = spec_;
      for (int c = 0; c < 2; ++c) *a.add_chunks() = InterleavedChunk(w + c * 2);
      owned[w]->Start(a);
    }
    return owned;
  }

  void ExpectNoFailure() {
    for (const auto& m : reports_.All()) {
      EXPECT_FALSE(m.has_failed()) << m.failed().message();
    }
  }

  gpipe::v1::JobSpec spec_;
  std::filesystem::path dir_;
  Reports reports_;
  std::unique_ptr<Executor> executors_[kStages];
  Executor* next_[kStages] = {};
  int64_t bad_eval_into_ = -1;  // BadFirstEvalBatch into this stage
};

TEST_F(ExecutorTest, StagesOverInProcessLinksMatchTheReferenceBitwise) {
  StartAll(/*epoch=*/1);
  ASSERT_EQ(reports_.WaitEnded(kStages), kStages);
  ExpectNoFailure();
  ExpectReferenceParameters();

  const StepPlan plan = StepPlan::FromSpec(spec_);
  std::map<int64_t, int> progress, checkpoints;  // step -> stages
  std::vector<int64_t> evaluations;
  for (const auto& m : reports_.All()) {
    if (m.has_progress()) {
      ++progress[m.progress().step()];
      // The plane of the link downstream: the last stage has none.
      EXPECT_EQ(m.progress().data_plane(),
                m.progress().stage() < kStages - 1 ? "in_process" : "");
    }
    if (m.has_checkpointed()) {
      const gpipe::v1::StageCheckpointed& c = m.checkpointed();
      ++checkpoints[c.step()];
      EXPECT_TRUE(plan.CheckpointsAfter(c.step())) << c.step();
      EXPECT_EQ(c.path(), storage::StageFilePath(
                              storage::CheckpointStepDir(
                                  storage::JobCheckpointDir(dir_.string(), "j"),
                                  c.step()),
                              1, c.stage()));
      EXPECT_TRUE(std::filesystem::exists(c.path())) << c.path();
      EXPECT_EQ(c.sha256().size(), 64u);
    }
    if (m.has_evaluated()) {
      EXPECT_EQ(m.evaluated().stage(), kStages - 1);
      evaluations.push_back(m.evaluated().evaluation().step());
    }
    if (m.has_finished()) {
      const std::string name =
          std::filesystem::path(m.finished().parameters_path())
              .filename()
              .string();
      std::optional<storage::StageFileId> id =
          storage::ParseStageFileName(name);
      ASSERT_TRUE(id.has_value()) << name;
      EXPECT_EQ(id->epoch, 1);
      EXPECT_EQ(id->stage, m.finished().stage());
      EXPECT_EQ(m.finished().has_evaluation(),
                m.finished().stage() == kStages - 1);
    }
  }
  for (int64_t s = 1; s <= spec_.steps(); ++s) EXPECT_EQ(progress[s], kStages);
  // Every 2 steps but the last of 7: 2, 4, 6; evaluations after 3 and 6.
  EXPECT_EQ(checkpoints, (std::map<int64_t, int>{{2, 3}, {4, 3}, {6, 3}}));
  EXPECT_EQ(evaluations, (std::vector<int64_t>{3, 6}));
}

// The spec's gradient groups are part of its numerics: stages on workers
// sum them in the reference trainer's tree.
// A stage whose part of the final evaluation fails (here a batch it cannot
// take) tells its neighbours, which pass it on: every stage ends its
// evaluation, the trained parameters are written and reported, and each
// finished report says why there is no evaluation (a job that trained to
// the end lost its model to its last step).
TEST_F(ExecutorTest, AFailedFinalEvaluationKeepsTheTrainedParameters) {
  spec_.mutable_eval()->set_every(0);  // the final evaluation only
  bad_eval_into_ = 2;
  StartAll(/*epoch=*/1);
  ASSERT_EQ(reports_.WaitEnded(kStages), kStages);
  ExpectNoFailure();
  ExpectReferenceParameters();
  std::set<int64_t> stages;
  for (const auto& m : reports_.All()) {
    if (!m.has_finished()) continue;
    const gpipe::v1::StageFinished& f = m.finished();
    stages.insert(f.stage());
    EXPECT_FALSE(f.parameters_path().empty());
    EXPECT_EQ(f.evaluation().counted(), 0);
    EXPECT_EQ(f.evaluation_failed_here(), f.stage() == 2) << f.stage();
    if (f.stage() == 2) {
      EXPECT_NE(f.evaluation_error().find("[1, 1]"), std::string::npos)
          << f.evaluation_error();
    } else {
      EXPECT_NE(f.evaluation_error().find("the evaluation ended: failure of "
                                          "stage 2's part of the evaluation"),
                std::string::npos)
          << f.evaluation_error();
    }
  }
  EXPECT_EQ(stages, (std::set<int64_t>{0, 1, 2}));
}

TEST_F(ExecutorTest, GradientGroupsSumAsTheReferenceDoes) {
  spec_.mutable_pipeline()->set_micro_batches(kMicroBatches);
  spec_.mutable_pipeline()->set_gradient_groups(kMicroBatches);
  StartAll(/*epoch=*/1);
  ASSERT_EQ(reports_.WaitEnded(kStages), kStages);
  ExpectNoFailure();
  ExpectReferenceParameters();
}

TEST_F(ExecutorTest, RestoresACheckpointAndEndsBitwiseEqual) {
  StartAll(/*epoch=*/1);
  ASSERT_EQ(reports_.WaitEnded(kStages), kStages);
  ExpectNoFailure();
  // Commit step 4 by hand, as the controller would, and replay from it in
  // a new epoch.
  std::vector<gpipe::v1::StageCheckpointed> step4;
  for (const auto& m : reports_.All()) {
    if (m.has_checkpointed() && m.checkpointed().step() == 4) {
      step4.push_back(m.checkpointed());
    }
  }
  ASSERT_EQ(step4.size(), static_cast<size_t>(kStages));
  absl::StatusOr<gpipe::v1::CheckpointRef> committed =
      controller::CommitCheckpoint(dir_.string(), "j", 1, step4);
  ASSERT_TRUE(committed.ok()) << committed.status();
  const std::string manifest_path = committed->manifest_path();

  reports_.Clear();
  StartAll(/*epoch=*/2, /*start_step=*/4, manifest_path);
  ASSERT_EQ(reports_.WaitEnded(kStages), kStages);
  ExpectNoFailure();
  int64_t first_step = spec_.steps();
  for (const auto& m : reports_.All()) {
    if (m.has_progress()) {
      first_step = std::min<int64_t>(first_step, m.progress().step());
    }
  }
  EXPECT_EQ(first_step, 5);
  ExpectReferenceParameters();
}

TEST_F(ExecutorTest, CancellingOneStageStopsItsNeighbours) {
  spec_.set_steps(100000);
  spec_.mutable_checkpoint()->set_every(0);
  spec_.mutable_eval()->set_every(0);
  StartAll(/*epoch=*/1);
  // Wait until the pipeline runs, then cancel the middle stage only.
  for (int i = 0; i < 600; ++i) {
    bool running = false;
    for (const auto& m : reports_.All()) running |= m.has_progress();
    if (running) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  executors_[1]->Cancel("j", 1);
  EXPECT_FALSE(executors_[1]->busy());
  // Its neighbours see their links close and fail (a lost link, retried by
  // the controller); the cancelled stage reports nothing.
  ASSERT_EQ(reports_.WaitEnded(2), 2);
  for (const auto& m : reports_.All()) {
    EXPECT_FALSE(m.has_finished());
    if (m.has_failed()) {
      EXPECT_NE(m.failed().stage(), 1);
      EXPECT_EQ(m.failed().reason(), "LinkFailed") << m.failed().message();
      EXPECT_FALSE(m.failed().permanent());
    }
  }
  for (int i = 0; i < 500 && (executors_[0]->busy() || executors_[2]->busy());
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(executors_[0]->busy());
  EXPECT_FALSE(executors_[2]->busy());
}

TEST_F(ExecutorTest, AnUpstreamLinkOfAnOlderEpochOrTheWrongStageIsRefused) {
  spec_.set_steps(100000);
  executors_[2]->Start(Assign(2, /*epoch=*/3));
  auto [a, b] = MakeInProcessLinkPair(4);
  absl::Status old = executors_[2]->AcceptUpstream(
      "j", 2, 1, 0, std::shared_ptr<Link>(std::move(b)), 1000);
  EXPECT_TRUE(absl::IsFailedPrecondition(old)) << old;
  auto [c, d] = MakeInProcessLinkPair(4);
  absl::Status wrong = executors_[2]->AcceptUpstream(
      "j", 3, 0, 0, std::shared_ptr<Link>(std::move(d)), 1000);
  EXPECT_TRUE(absl::IsFailedPrecondition(wrong)) << wrong;
  EXPECT_NE(wrong.message().find("from stage 0"), std::string_view::npos);
  // Another replica's stage 1, and a reduction link (the same stage) to a
  // job of one replica.
  auto [e, f] = MakeInProcessLinkPair(4);
  absl::Status replica = executors_[2]->AcceptUpstream(
      "j", 3, 1, 1, std::shared_ptr<Link>(std::move(f)), 1000);
  EXPECT_TRUE(absl::IsFailedPrecondition(replica)) << replica;
  EXPECT_NE(replica.message().find("of replica 1"), std::string_view::npos)
      << replica;
  auto [g, h] = MakeInProcessLinkPair(4);
  absl::Status reduction = executors_[2]->AcceptUpstream(
      "j", 3, 2, 0, std::shared_ptr<Link>(std::move(h)), 1000);
  EXPECT_TRUE(absl::IsFailedPrecondition(reduction)) << reduction;
  executors_[2]->CancelAll();
}

TEST_F(ExecutorTest, AStageLargerThanTheMemoryBudgetFailsAsOutOfMemory) {
  // The memory model's figure for stage 1 exceeds a 1 KiB budget: refused
  // before anything is allocated or connected, as the job's failure.
  executors_[1]->set_memory_budget(1024);
  executors_[1]->Start(Assign(1, /*epoch=*/1));
  ASSERT_EQ(reports_.WaitEnded(1), 1);
  const auto all = reports_.All();
  ASSERT_EQ(all.size(), 1u);
  ASSERT_TRUE(all[0].has_failed());
  const gpipe::v1::StageFailed& f = all[0].failed();
  EXPECT_EQ(f.reason(), "OutOfMemory");
  EXPECT_TRUE(f.permanent());
  EXPECT_NE(f.message().find("stage 1 needs"), std::string::npos)
      << f.message();
  EXPECT_NE(f.message().find("more than this worker's memory for stages, "
                             "1.00 KiB"),
            std::string::npos)
      << f.message();
}

// Starting weights of a later model format than this gpipe reads are the
// job's fault, as every other unusable file is: the stage fails for good
// (InvalidData). It failed as a lost link, and the job went round ten
// restarts where the stages, not the controller, read the file.
TEST_F(ExecutorTest, StartingWeightsOfALaterFormatFailTheJobForGood) {
  auto ref = ReferenceTrainer::Create(spec_, kMicroBatches);
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::vector<std::pair<std::string, const Tensor*>> tensors;
  for (const NamedTensor& t : (*ref)->StateTensors())
    tensors.emplace_back(t.name, t.tensor);
  std::filesystem::create_directories(dir_);
  const std::string path = (dir_ / "later.safetensors").string();
  ASSERT_TRUE(
      WriteSafetensors(path, tensors,
                       {{"gpipe.format_version", "99"}, {"gpipe.step", "0"}})
          .ok());
  spec_.mutable_init_from()->set_path(path);
  StartAll(1);
  ASSERT_EQ(reports_.WaitEnded(kStages), kStages);
  int refused = 0;
  for (const auto& m : reports_.All()) {
    ASSERT_TRUE(m.has_failed());
    if (m.failed().reason() != "InvalidData") continue;
    ++refused;
    EXPECT_TRUE(m.failed().permanent());
    EXPECT_NE(m.failed().message().find(
                  "model format version 99 is newer than this gpipe reads"),
              std::string::npos)
        << m.failed().message();
  }
  EXPECT_GE(refused, 1);
}

TEST_F(ExecutorTest, AnAllocationPastTheBudgetFailsTheStageNotTheWorker) {
  // The estimate fits 64 MiB, but this process already holds more tensor
  // memory than that (as another tenant would): the stage's first
  // allocation is refused, the stage unwinds and reports, and the executor
  // takes the next assignment.
  const int64_t budget = int64_t{64} << 20;
  Tensor tenant = Tensor::Empty(Shape{budget / 4 + 1});
  for (auto& e : executors_) e->set_memory_budget(budget);
  StartAll(1);
  ASSERT_EQ(reports_.WaitEnded(kStages), kStages);
  int out_of_memory = 0;
  for (const auto& m : reports_.All()) {
    if (!m.has_failed()) continue;
    if (m.failed().reason() == "OutOfMemory") {
      ++out_of_memory;
      EXPECT_TRUE(m.failed().permanent());
      EXPECT_NE(m.failed().message().find("would exceed this worker's "
                                          "memory for stages, 64.0 MiB"),
                std::string::npos)
          << m.failed().message();
    }
  }
  EXPECT_GE(out_of_memory, 1);
  tenant = Tensor();
  reports_.Clear();
  StartAll(2);
  ASSERT_EQ(reports_.WaitEnded(kStages), kStages);
  for (const auto& m : reports_.All()) {
    EXPECT_FALSE(m.has_failed()) << m.failed().message();
  }
}

// Two workers of two chunks each run the interleaved schedule: each chunk
// checkpoints, reports and writes its parameters as the stage it is, the
// last stage's chunk evaluates, and the result is the reference's bits.
TEST_F(ExecutorTest, InterleavedChunksOnTwoWorkersMatchTheReferenceBitwise) {
  constexpr int kWorkers = 2, kChunks = 2;
  std::vector<std::unique_ptr<Executor>> workers = StartInterleaved();
  ASSERT_EQ(reports_.WaitEnded(kWorkers * kChunks), kWorkers * kChunks);
  ExpectNoFailure();
  ExpectReferenceParameters();
  std::map<int64_t, std::set<int64_t>> checkpointed;  // step -> stages
  std::set<int64_t> evaluated_by;
  for (const auto& m : reports_.All()) {
    if (m.has_checkpointed())
      checkpointed[m.checkpointed().step()].insert(m.checkpointed().stage());
    if (m.has_evaluated()) evaluated_by.insert(m.evaluated().stage());
  }
  const std::set<int64_t> all = {0, 1, 2, 3};
  EXPECT_EQ(checkpointed, (std::map<int64_t, std::set<int64_t>>{
                              {2, all}, {4, all}, {6, all}}));
  EXPECT_EQ(evaluated_by, (std::set<int64_t>{3}));
  // A link for a stage this worker does not run names those it does.
  for (int w = kWorkers - 1; w >= 0; --w) {
    gpipe::v1::Assignment a = InterleavedChunk(w);
    a.set_epoch(2);
    *a.mutable_spec() = spec_;
    a.mutable_spec()->set_steps(100000);
    for (int c = 0; c < kChunks; ++c) {
      *a.add_chunks() = InterleavedChunk(w + c * kWorkers);
      a.mutable_chunks(c)->set_epoch(2);
    }
    workers[w]->Start(a);
  }
  auto [mine, theirs] = MakeInProcessLinkPair(4);
  const absl::Status wrong = workers[0]->AcceptUpstream(
      "j", 2, 0, 0, std::shared_ptr<Link>(std::move(theirs)), 1000);
  EXPECT_TRUE(absl::IsFailedPrecondition(wrong)) << wrong;
  EXPECT_NE(wrong.message().find("runs stages 0, 2"), std::string_view::npos)
      << wrong;
  for (auto& w : workers) w->CancelAll();
}

// The same when each worker evaluates its chunks at once: the last chunk's
// failure ends both workers' evaluations, and each keeps its parameters.
TEST_F(ExecutorTest, AFailedFinalEvaluationOfInterleavedChunksKeepsThem) {
  spec_.mutable_eval()->set_every(0);
  bad_eval_into_ = 3;
  std::vector<std::unique_ptr<Executor>> workers = StartInterleaved();
  ASSERT_EQ(reports_.WaitEnded(4), 4);
  ExpectNoFailure();
  ExpectReferenceParameters();
  std::map<int64_t, bool> here;  // stage -> its own part failed
  for (const auto& m : reports_.All()) {
    if (!m.has_finished()) continue;
    EXPECT_FALSE(m.finished().parameters_path().empty());
    EXPECT_FALSE(m.finished().evaluation_error().empty());
    here[m.finished().stage()] = m.finished().evaluation_failed_here();
  }
  // Worker 1 runs stages 1 and 3; its report says stage 3's failure.
  EXPECT_EQ(here, (std::map<int64_t, bool>{
                      {0, false}, {1, true}, {2, false}, {3, true}}));
  for (auto& w : workers) w->CancelAll();
}

// Chunks that are not the worker's stages w, w + K, ... fail the assignment
// by name, as bad input: nothing is built.
TEST_F(ExecutorTest, ChunksOfOtherStagesAreRefusedByName) {
  gpipe::v1::Assignment a = Assign(0, /*epoch=*/1);
  a.set_stages(4);
  a.set_schedule(gpipe::v1::INTERLEAVED_1F1B);
  for (int64_t stage : {0, 1}) {
    gpipe::v1::Assignment c = a;
    c.clear_spec();
    c.set_stage(stage);
    *a.add_chunks() = c;
  }
  executors_[0]->Start(a);
  ASSERT_EQ(reports_.WaitEnded(1), 1);
  const auto all = reports_.All();
  ASSERT_TRUE(all[0].has_failed());
  EXPECT_EQ(all[0].failed().reason(), "InvalidData");
  EXPECT_NE(all[0].failed().message().find(
                "chunk 1 is stage 1 of 4 of j epoch 1; worker 0's chunk 1 is "
                "stage 2"),
            std::string::npos)
      << all[0].failed().message();
}

// ZB-V's phase times come from the controller, three a stage: any other
// count, or a time out of range, fails the assignment by name before
// anything is built (workers that ordered differently would deadlock).
TEST_F(ExecutorTest, ZeroBubbleVPhaseTimesThatAreNotASetPerStageAreRefused) {
  for (const std::vector<int64_t>& ticks : std::vector<std::vector<int64_t>>{
           {1000, 1000, 1000, 5},
           {1, 1, 1, 1, 1, 1, 1, 1, 1},
           {1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1},
           {1, 1, 1, 1, 1, 1, 1, 1, 1, 1 << 30, 1, 1}}) {
    gpipe::v1::Assignment a = Assign(0, /*epoch=*/1);
    a.set_stages(4);
    a.set_schedule(gpipe::v1::ZERO_BUBBLE_V);
    for (int64_t stage : {0, 3}) {
      gpipe::v1::Assignment c = a;
      c.clear_spec();
      c.set_stage(stage);
      *a.add_chunks() = c;
    }
    for (int64_t t : ticks) a.add_phase_ticks(t);
    reports_.Clear();
    executors_[0]->Start(a);
    ASSERT_EQ(reports_.WaitEnded(1), 1);
    const auto all = reports_.All();
    ASSERT_TRUE(all[0].has_failed());
    EXPECT_EQ(all[0].failed().reason(), "InvalidData");
    EXPECT_NE(all[0].failed().message().find("assignment: "), std::string::npos)
        << all[0].failed().message();
    EXPECT_NE(all[0].failed().message().find(
                  ticks.size() % 3 == 0 ? "phase time" : "phase_ticks"),
              std::string::npos)
        << all[0].failed().message();
  }
}

// The whole of `spec`'s model as one stage of job `job` in `epoch`.
gpipe::v1::Assignment OneStage(const gpipe::v1::JobSpec& spec,
                               const std::string& job, int64_t epoch) {
  gpipe::v1::Assignment a;
  a.set_job_id(job);
  a.set_epoch(epoch);
  *a.mutable_spec() = spec;
  a.set_stage(0);
  a.set_stages(1);
  a.set_layer_begin(0);
  a.set_layer_end(spec.model().layers_size());
  a.set_micro_batches(1);
  a.set_checkpoint_transport(gpipe::v1::CHECKPOINT_TRANSPORT_SHARED_PATH);
  return a;
}

// Until the first step's report (the second step has just begun), 60 s at
// most.
bool AwaitProgress(Reports& reports) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    for (const auto& m : reports.All())
      if (m.has_progress()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// The bubble gauge a worker exports for its cut: the assignment's (the
// cost model's) until the controller sends the one the stages' measured
// times explain, which replaces it for that assignment only.
TEST(ExecutorCutBubbleTest, TheControllersMeasuredBubbleReplacesTheCostModels) {
  auto spec = ParseJobSpecJson(kSpec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_steps(100000);
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  Reports reports;
  Executor executor(
      1, [&](const gpipe::v1::WorkerMessage& m) { reports.Add(m); }, &metrics);
  gpipe::v1::Assignment a = OneStage(*spec, "long", 3);
  a.set_predicted_bubble(0.4);
  executor.Start(a);
  const auto gauge = [&]() -> std::optional<double> {
    for (const prometheus::MetricFamily& f : registry.Collect()) {
      if (f.name != "gpipe_stage_bubble_predicted_ratio") continue;
      for (const prometheus::ClientMetric& m : f.metric) {
        for (const prometheus::ClientMetric::Label& l : m.label) {
          if (l.name == "job" && l.value == "long") return m.gauge.value;
        }
      }
    }
    return std::nullopt;
  };
  ASSERT_TRUE(AwaitProgress(reports));
  EXPECT_EQ(gauge(), std::optional<double>(0.4));
  executor.SetCutBubble("long", 2, 0.1);   // an older epoch's
  executor.SetCutBubble("other", 3, 0.1);  // another job's
  executor.SetCutBubble("long", 3, std::nan(""));
  EXPECT_EQ(gauge(), std::optional<double>(0.4));
  executor.SetCutBubble("long", 3, 0.25);
  EXPECT_EQ(gauge(), std::optional<double>(0.25));
  executor.Cancel("long", 3);
  for (const auto& m : reports.All()) EXPECT_FALSE(m.has_failed());
}

TEST(ExecutorCancelTest, ACancelStopsComputeWithinALayerOp) {
  // One stage of 48 Linear+ReLU pairs on a 512-wide batch of 512: a step
  // takes a second or more, each layer op a few tens of milliseconds.
  std::string layers;
  for (int i = 0; i < 48; ++i) {
    layers += R"({"linear": {"inFeatures": 512, "outFeatures": 512}},)";
    layers += R"({"relu": {}},)";
  }
  auto spec = ParseJobSpecJson(absl::StrCat(
      R"({"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [512]}},
          "layers": [)",
      layers, R"({"linear": {"inFeatures": 512, "outFeatures": 3}}],
          "loss": {"softmaxCrossEntropy": {}}},
        "optimizer": {"lr": 0.001, "sgd": {}},
        "data": {"synthetic": {"task": "CLASSES", "features": 512,
                 "classes": 3, "trainSamples": 2048, "testSamples": 64}},
        "batchSize": 512, "steps": 1000, "seed": 5})"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  Reports reports;
  Executor executor(1,
                    [&](const gpipe::v1::WorkerMessage& m) { reports.Add(m); });
  executor.Start(OneStage(*spec, "long", 1));
  ASSERT_TRUE(AwaitProgress(reports));
  const auto start = std::chrono::steady_clock::now();
  executor.Cancel("long", 1);  // returns once the stage's thread has ended
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("cancel took %.3f s\n", seconds);
  EXPECT_LT(seconds, 0.5);
  EXPECT_FALSE(executor.busy());
  for (const auto& m : reports.All()) EXPECT_FALSE(m.has_failed());
}

}  // namespace
}  // namespace gpipe
