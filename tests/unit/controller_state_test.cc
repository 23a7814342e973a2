// The controller's state machine below gRPC, on a clock the test advances
// by hand: leases expire exactly at the heartbeat timeout, a restarting job
// waits its settle time, an elastic job its grace period, and checkpoint
// commits and restore-point checks run off the lock (FlushIo waits for
// them): nothing here sleeps to see that nothing happened.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "controller/controller.h"
#include "controller/job_status.h"
#include "controller/recovery.h"
#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/simulator.h"
#include "services/storage/checkpoint_layout.h"
#include "services/storage/safetensors.h"
#include "services/telemetry/step_figures.h"
#include "tests/support/controller_fixtures.h"
#include "tests/support/npy_file.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;

class FakeClock {
 public:
  absl::Time Now() {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }

 private:
  std::mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

// The value of the first series of counter family `name`; -1 when the
// family is missing.
double FirstCounter(ControllerMetrics& metrics, std::string_view name) {
  for (const auto& family : metrics.Collect()) {
    if (family.name == name) return family.metric.at(0).counter.value;
  }
  return -1;
}

// What a stage that cannot write its checkpoint says.
constexpr char kNoSpace[] = "checkpoint: No space left on device";

class ControllerStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat(
               "controller_state_test-", getpid(), "-",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    controller_ = std::make_unique<Controller>(Options());
  }
  ControllerOptions Options() {
    ControllerOptions o;
    o.checkpoint_dir = dir_.string();
    // The fake stages below write their files where shared-path stages do
    // (controller_stage_files_test covers the files through the API).
    o.checkpoint_transport = v1::CHECKPOINT_TRANSPORT_SHARED_PATH;
    o.heartbeat_timeout = absl::Seconds(10);
    o.clock = [this] { return clock_.Now(); };
    return o;
  }
  // A fresh controller on a job store in dir_, counting into `metrics`
  // (may be null), after the one before (its file work done) stops: a
  // restart of the controller process.
  void RestartOnStore(ControllerMetrics* metrics) {
    if (controller_ != nullptr) controller_->FlushIo();
    controller_.reset();
    ControllerOptions o = Options();
    o.store_path = (dir_ / "jobs.db").string();
    o.metrics = metrics;
    std::filesystem::create_directories(dir_);
    controller_ = std::make_unique<Controller>(o);
    ASSERT_TRUE(controller_->Recover().ok());
  }
  // A fresh controller that counts into `metrics`.
  void UseMetrics(ControllerMetrics* metrics) {
    ControllerOptions o = Options();
    o.metrics = metrics;
    controller_ = std::make_unique<Controller>(o);
  }
  // What a stage sends when it fails.
  static v1::WorkerMessage Failure(const std::string& job, int64_t epoch,
                                   int64_t stage, const std::string& reason,
                                   const std::string& message,
                                   bool permanent = false) {
    v1::WorkerMessage m;
    v1::StageFailed& f = *m.mutable_failed();
    f.set_job_id(job);
    f.set_epoch(epoch);
    f.set_stage(stage);
    f.set_reason(reason);
    f.set_message(message);
    f.set_permanent(permanent);
    return m;
  }
  // A second passes: the restart's settle time, its restore point's check
  // off the lock, and the scheduling that follows.
  void Settle() {
    clock_.Advance(absl::Seconds(1));
    controller_->Tick(clock_.Now());
    controller_->FlushIo();
    controller_->Tick(clock_.Now());
  }
  // `a`'s stage reports and commits a checkpoint of each step.
  void CommitSteps(WorkerRecord& w, const v1::Assignment& a,
                   std::initializer_list<int64_t> steps) {
    for (int64_t step : steps) {
      controller_->HandleMessage(w, test_support::Progressed(a, step));
      controller_->HandleMessage(w, test_support::Checkpointed(a, step));
      controller_->FlushIo();
    }
  }
  void TearDown() override {
    controller_.reset();
    std::filesystem::remove_all(dir_);
  }

  v1::JobSpec Spec(int64_t stages, int64_t max_restarts) {
    return test_support::RecoverableSpec(stages, max_restarts);
  }
  // A job of `stages` workers holding chunks under `schedule`, cut by the
  // cost model, that may run on one worker after a grace period of 1 s.
  v1::JobSpec ChunkedSpec(int64_t stages, v1::Schedule schedule,
                          int64_t micro_batches) {
    v1::JobSpec spec = Spec(stages, 2);
    spec.mutable_pipeline()->set_schedule(schedule);
    spec.mutable_pipeline()->set_micro_batches(micro_batches);
    spec.mutable_pipeline()->clear_balance();
    spec.mutable_pipeline()->set_min_stages(1);
    spec.mutable_pipeline()->set_elastic_grace_ms(1000);
    return spec;
  }
  // `runs_chunks`: the worker says it runs an interleaved schedule's chunks,
  // `runs_zb_v` that it places ZB-V's in a V, as every current one does.
  std::shared_ptr<WorkerRecord> Attach(int i, bool runs_chunks = true,
                                       bool runs_zb_v = true) {
    v1::WorkerHello hello;
    hello.set_worker_id(absl::StrCat("w", i));
    hello.set_address(absl::StrCat("127.0.0.1:", 9000 + i));
    if (runs_chunks) hello.add_capabilities(std::string(kChunksCapability));
    if (runs_chunks && runs_zb_v)
      hello.add_capabilities(std::string(kZeroBubbleVCapability));
    absl::StatusOr<std::shared_ptr<WorkerRecord>> w =
        controller_->AttachWorker(hello, "", [this] { ++disconnects_; });
    EXPECT_TRUE(w.ok()) << w.status();
    return *w;
  }
  // The next assignment queued for `w`, without waiting.
  std::optional<v1::Assignment> Assignment(WorkerRecord& w) {
    for (;;) {
      Outgoing out = controller_->NextMessage(w, absl::ZeroDuration());
      if (!out.message.has_value()) return std::nullopt;
      if (out.message->has_assignment()) return out.message->assignment();
    }
  }
  v1::JobState State(const std::string& id) {
    absl::StatusOr<v1::Job> job = controller_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->status().state() : v1::JOB_STATE_UNSPECIFIED;
  }
  // A one-stage job (checkpoints every 2 steps) running on w1, w2 free.
  struct OneStageJob {
    std::shared_ptr<WorkerRecord> w1, w2;
    std::string id;
    std::optional<v1::Assignment> a;  // w1's
  };
  // The one stage of `j` finished, its final parameters written where the
  // controller expects them.
  v1::WorkerMessage FinishedWithParameters(const OneStageJob& j) {
    v1::WorkerMessage done;
    v1::StageFinished& f = *done.mutable_finished();
    f.set_job_id(j.id);
    f.set_epoch(j.a->epoch());
    f.set_stage(0);
    const std::string final_path =
        FinalFilePath(dir_.string(), j.id, j.a->epoch(), 0);
    std::filesystem::create_directories(
        std::filesystem::path(final_path).parent_path());
    const Tensor weight = Tensor::Zeros(Shape{2, 2}, DType::kF32);
    EXPECT_TRUE(
        WriteSafetensors(final_path, {{"layers.0.weight", &weight}}, {}).ok());
    f.set_parameters_path(final_path);
    return done;
  }
  OneStageJob StartOneStageJob() {
    OneStageJob j;
    j.w1 = Attach(1);
    j.w2 = Attach(2);
    absl::StatusOr<v1::Job> job = controller_->SubmitJob(Spec(1, 2));
    EXPECT_TRUE(job.ok()) << job.status();
    if (job.ok()) j.id = job->id();
    j.a = Assignment(*j.w1);
    return j;
  }
  // Workers w1 and w2 running stages 0 and 1 of a job that allows
  // `max_restarts`.
  struct TwoStageJob {
    std::shared_ptr<WorkerRecord> w1, w2;
    std::string id;
    v1::Assignment a1, a2;
  };
  TwoStageJob StartTwoStageJob(int64_t max_restarts) {
    TwoStageJob j;
    j.w1 = Attach(1);
    j.w2 = Attach(2);
    absl::StatusOr<v1::Job> job = controller_->SubmitJob(Spec(2, max_restarts));
    EXPECT_TRUE(job.ok()) << job.status();
    if (job.ok()) j.id = job->id();
    std::optional<v1::Assignment> a1 = Assignment(*j.w1);
    std::optional<v1::Assignment> a2 = Assignment(*j.w2);
    EXPECT_TRUE(a1.has_value() && a2.has_value());
    if (a1) j.a1 = *a1;
    if (a2) j.a2 = *a2;
    return j;
  }
  // 2 stages x 2 replicas, 2 micro-batches, 5 restarts.
  v1::JobSpec ReplicatedSpec() {
    v1::JobSpec spec = Spec(2, 5);
    spec.mutable_pipeline()->set_micro_batches(2);
    spec.mutable_pipeline()->set_replicas(2);
    return spec;
  }
  // Workers w1..w4 running ReplicatedSpec(): stage i of replica r on
  // w[r * 2 + i].
  struct ReplicatedJob {
    std::vector<std::shared_ptr<WorkerRecord>> w;
    std::string id;
    std::vector<v1::Assignment> a;  // w's, in order
  };
  ReplicatedJob StartReplicatedJob() {
    ReplicatedJob j;
    for (int i = 1; i <= 4; ++i) j.w.push_back(Attach(i));
    absl::StatusOr<v1::Job> job = controller_->SubmitJob(ReplicatedSpec());
    EXPECT_TRUE(job.ok()) << job.status();
    if (job.ok()) j.id = job->id();
    for (auto& worker : j.w) {
      std::optional<v1::Assignment> next = Assignment(*worker);
      EXPECT_TRUE(next.has_value());
      j.a.push_back(next.value_or(v1::Assignment()));
    }
    return j;
  }
  // `w`'s stage of `a` kept its state in memory after `step`.
  void Park(WorkerRecord& w, const v1::Assignment& a, int64_t step) {
    v1::WorkerMessage m;
    v1::StageParked& p = *m.mutable_parked();
    p.set_job_id(a.job_id());
    p.set_epoch(a.epoch());
    p.set_stage(a.stage());
    p.set_replica(a.replica());
    p.set_step(step);
    p.set_layer_begin(a.layer_begin());
    p.set_layer_end(a.layer_end());
    p.set_last_update_step(step - 1);
    controller_->HandleMessage(w, m);
  }
  // `w`'s stage of `a` reports that its link to a neighbour broke.
  void BreakLink(WorkerRecord& w, const v1::Assignment& a) {
    controller_->HandleMessage(
        w, Failure(a.job_id(), a.epoch(), a.stage(), "LinkFailed",
                   "the neighbouring stage closed the link"));
  }

  // Loses `lost`; once the settle time and the restore point's check are
  // done, the job's next assignment, on `next`.
  std::optional<v1::Assignment> RestartOn(WorkerRecord& lost,
                                          WorkerRecord& next) {
    controller_->DetachWorker(lost, absl::UnavailableError("gone"), "test");
    Settle();
    return Assignment(next);
  }

  std::filesystem::path dir_;
  FakeClock clock_;
  std::atomic<int> disconnects_{0};
  std::unique_ptr<Controller> controller_;
};

// A stage that fails on a loss that is not finite never reports that
// step: the controller's gpipe_job_loss turns NaN, so the
// GpipeLossNotFinite alert sees it.
TEST_F(ControllerStateTest, ALossThatIsNotFiniteShowsAsTheJobsLoss) {
  ControllerMetrics metrics;
  RestartOnStore(&metrics);
  OneStageJob j = StartOneStageJob();
  ASSERT_TRUE(j.a.has_value());
  controller_->HandleMessage(*j.w1,
                             Failure(j.id, j.a->epoch(), 0, "LossNotFinite",
                                     "the loss is not finite (nan) at step 3",
                                     /*permanent=*/true));
  EXPECT_EQ(State(j.id), v1::FAILED);
  const auto loss_is_nan = [](ControllerMetrics& m) {
    bool nan = false;
    for (const auto& family : m.Collect()) {
      if (family.name != "gpipe_job_loss") continue;
      for (const auto& s : family.metric)
        nan = nan || std::isnan(s.gauge.value);
    }
    return nan;
  };
  EXPECT_TRUE(loss_is_nan(metrics)) << "gpipe_job_loss is not NaN";
  // Every failed job counts, whatever its reason (GpipeJobFailed).
  EXPECT_EQ(FirstCounter(metrics, "gpipe_jobs_failed_total"), 1);
  // A restarted controller exports it again until the job is deleted: a
  // routine restart cleared the alert.
  ControllerMetrics after;
  RestartOnStore(&after);
  EXPECT_EQ(State(j.id), v1::FAILED);
  EXPECT_TRUE(loss_is_nan(after))
      << "gpipe_job_loss is not NaN after a controller restart";
}

// Series of `family` in `metrics` for job `id`.
int SeriesOf(ControllerMetrics& metrics, const std::string& family,
             const std::string& id) {
  int n = 0;
  for (const auto& f : metrics.Collect()) {
    if (f.name != family) continue;
    for (const auto& m : f.metric)
      for (const auto& l : m.label) n += l.name == "job" && l.value == id;
  }
  return n;
}

// A job whose final evaluation failed after its training keeps its model:
// it succeeds, saying why it has no evaluation (the stage whose own part
// failed says it, not the stages it ended).
TEST_F(ControllerStateTest, AFailedFinalEvaluationKeepsTheModel) {
  OneStageJob j = StartOneStageJob();
  ASSERT_TRUE(j.a.has_value());
  v1::WorkerMessage done = FinishedWithParameters(j);
  done.mutable_finished()->set_evaluation_error(
      "out of memory: a tensor of 12.0 MiB with 239 MiB of tensors in use "
      "would exceed this worker's memory for stages, 205 MiB");
  done.mutable_finished()->set_evaluation_failed_here(true);
  controller_->HandleMessage(*j.w1, done);
  controller_->FlushIo();
  absl::StatusOr<v1::Job> job = controller_->GetJob(j.id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->status().state(), v1::SUCCEEDED);
  EXPECT_FALSE(job->status().model_path().empty());
  EXPECT_EQ(job->status().evaluation().counted(), 0);
  EXPECT_EQ(job->status().evaluation_error(),
            done.finished().evaluation_error());
  bool said = false;
  for (const v1::Condition& c : job->status().conditions()) {
    if (c.type() != "Complete") continue;
    said = c.status() && c.reason() == "FinalEvaluationFailed" &&
           c.message().find("; the final evaluation failed: out of memory") !=
               std::string::npos;
  }
  EXPECT_TRUE(said) << job->status().DebugString();
}

// A job whose stages all finished keeps its loss but not its step times, as
// a failed or cancelled one, and as a restarted controller shows it (a
// succeeded job kept them until the controller restarted).
TEST_F(ControllerStateTest, AJobsStepTimesGoWhenItsStagesFinish) {
  ControllerMetrics metrics;
  UseMetrics(&metrics);
  OneStageJob j = StartOneStageJob();
  ASSERT_TRUE(j.a.has_value());
  // The step time is measured after the first few steps' reports.
  for (int64_t step = 1; step <= 4; ++step) {
    v1::WorkerMessage p = test_support::Progressed(*j.a, step);
    p.mutable_progress()->set_loss(0.5);
    p.mutable_progress()->set_step_seconds(0.25);
    controller_->HandleMessage(*j.w1, p);
  }
  ASSERT_EQ(SeriesOf(metrics, "gpipe_job_step_seconds", j.id), 1);
  // The stage's final file, so that the merge succeeds: the path to
  // SUCCEEDED is the one that kept the series (a failed merge ends the job
  // through EndJob, which dropped them already).
  controller_->HandleMessage(*j.w1, FinishedWithParameters(j));
  controller_->FlushIo();
  EXPECT_EQ(State(j.id), v1::SUCCEEDED);
  EXPECT_EQ(SeriesOf(metrics, "gpipe_job_step_seconds", j.id), 0);
  EXPECT_EQ(SeriesOf(metrics, "gpipe_job_loss", j.id), 1);
  controller_.reset();  // before `metrics` goes
}

// A store with room for exactly the checkpoints a job keeps failed every
// new one for good (the oldest went only after the new one committed): a
// full store now drops the oldest and the job keeps one fewer. The failed
// write's file of the old epoch goes at the restart, and the failure is
// counted by reason.
TEST_F(ControllerStateTest, AFullStoreMakesRoomByKeepingFewerCheckpoints) {
  ControllerMetrics metrics;
  UseMetrics(&metrics);
  OneStageJob j = StartOneStageJob();
  ASSERT_TRUE(j.a.has_value());
  const v1::Assignment a = *j.a;
  CommitSteps(*j.w1, a, {2, 4});
  controller_->HandleMessage(*j.w1, test_support::Progressed(a, 6));
  // Step 6's write filled the store: its file stays behind, partial.
  const std::string step2 = storage::CheckpointStepDir(a.checkpoint_dir(), 2);
  const std::string step6 = storage::CheckpointStepDir(a.checkpoint_dir(), 6);
  const std::string partial = storage::StageFilePath(step6, a.epoch(), 0);
  std::filesystem::create_directories(step6);
  std::ofstream(partial) << "half a checkpoint";
  controller_->HandleMessage(
      *j.w1, Failure(j.id, a.epoch(), 0, "CheckpointStoreFull", kNoSpace));
  controller_->FlushIo();
  absl::StatusOr<v1::Job> job = controller_->GetJob(j.id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->status().state(), v1::RESTARTING);
  EXPECT_EQ(job->status().restarts(), 0);
  // Nothing is dropped before the restart has checked what it restores.
  EXPECT_EQ(job->status().checkpoints_size(), 2);

  Settle();
  controller_->FlushIo();
  std::optional<v1::Assignment> b = Assignment(*j.w1);
  std::shared_ptr<WorkerRecord> on = j.w1;
  if (!b) b = Assignment(*j.w2), on = j.w2;
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->start_step(), 4);
  EXPECT_EQ(State(j.id), v1::RUNNING);
  job = controller_->GetJob(j.id);
  ASSERT_EQ(job->status().checkpoints_size(), 1);
  EXPECT_EQ(job->status().checkpoints(0).step(), 4);
  EXPECT_FALSE(std::filesystem::exists(step2));
  EXPECT_FALSE(std::filesystem::exists(partial));  // epoch 1's, failed
  // Step 6 commits, and the job keeps one checkpoint now: step 4 goes.
  controller_->HandleMessage(*on, test_support::Progressed(*b, 6));
  controller_->HandleMessage(*on, test_support::Checkpointed(*b, 6));
  controller_->FlushIo();
  job = controller_->GetJob(j.id);
  ASSERT_EQ(job->status().checkpoints_size(), 1);
  EXPECT_EQ(job->status().checkpoints(0).step(), 6);
  EXPECT_FALSE(std::filesystem::exists(
      storage::CheckpointStepDir(a.checkpoint_dir(), 4)));
  // Stored with the job, so a restarted controller keeps one too.
  EXPECT_EQ(job->status().checkpoint_keep(), 1);
  // A cancel takes what the job never committed with it, and only that.
  const std::string step8 = storage::CheckpointStepDir(a.checkpoint_dir(), 8);
  std::filesystem::create_directories(step8);
  std::ofstream(storage::StageFilePath(step8, b->epoch(), 0)) << "half";
  ASSERT_TRUE(controller_->CancelJob(j.id).ok());
  controller_->FlushIo();
  EXPECT_FALSE(std::filesystem::exists(step8));
  EXPECT_TRUE(std::filesystem::exists(
      storage::CheckpointStepDir(a.checkpoint_dir(), 6)));

  double store_full = -1, recoveries = -1;
  for (const auto& family : metrics.Collect()) {
    for (const auto& m : family.metric) {
      if (family.name == "gpipe_checkpoint_failures_total" &&
          m.label.size() == 2 && m.label[1].value == "store_full") {
        store_full = m.counter.value;
      }
      if (family.name == "gpipe_recovery_duration_seconds") {
        recoveries = static_cast<double>(m.histogram.sample_count);
      }
    }
  }
  EXPECT_EQ(store_full, 1);
  EXPECT_EQ(recoveries, 1);
}

// A full store drops the oldest checkpoint only once the restart knows the
// newest is intact: with the newest corrupt, the oldest is what it
// restores, and it stays.
TEST_F(ControllerStateTest, AFullStoreKeepsTheOnlyIntactCheckpoint) {
  OneStageJob j = StartOneStageJob();
  ASSERT_TRUE(j.a.has_value());
  const v1::Assignment a = *j.a;
  CommitSteps(*j.w1, a, {2, 4});
  std::ofstream(
      storage::StageFilePath(storage::CheckpointStepDir(a.checkpoint_dir(), 4),
                             a.epoch(), 0),
      std::ios::binary)
      << "step 4, damaged";
  controller_->HandleMessage(
      *j.w1, Failure(j.id, a.epoch(), 0, "CheckpointStoreFull", kNoSpace));
  Settle();
  controller_->FlushIo();
  std::optional<v1::Assignment> b = Assignment(*j.w1);
  if (!b) b = Assignment(*j.w2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->start_step(), 2);
  absl::StatusOr<v1::Job> job = controller_->GetJob(j.id);
  ASSERT_EQ(job->status().checkpoints_size(), 1);
  EXPECT_EQ(job->status().checkpoints(0).step(), 2);
  EXPECT_TRUE(std::filesystem::exists(
      storage::CheckpointStepDir(a.checkpoint_dir(), 2)));
}

// A stage that cannot write its checkpoint closes its link, and its
// neighbour's LinkFailed often arrives first (CI saw it). The link failure
// waits for its cause: the full store's report restarts the job, not
// counted, so even a job that allows no restarts goes on, and
// gpipe_job_restarts_total stays 0.
TEST_F(ControllerStateTest, AFullStoreReportedAfterItsNeighboursLinkFailure) {
  ControllerMetrics metrics;
  UseMetrics(&metrics);
  TwoStageJob j = StartTwoStageJob(/*max_restarts=*/0);
  BreakLink(*j.w2, j.a2);
  EXPECT_EQ(State(j.id), v1::RUNNING);  // held for its cause
  clock_.Advance(kLinkFailureHold / 2);
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(j.id), v1::RUNNING);
  controller_->HandleMessage(*j.w1, Failure(j.id, j.a1.epoch(), j.a1.stage(),
                                            "CheckpointStoreFull", kNoSpace));
  absl::StatusOr<v1::Job> got = controller_->GetJob(j.id);
  EXPECT_EQ(got->status().state(), v1::RESTARTING);
  EXPECT_EQ(got->status().restarts(), 0);
  const v1::Condition* running = FindCondition(got->status(), kRunning);
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->reason(), "CheckpointStoreFull");
  // The hold is used up: its end restarts nothing more.
  clock_.Advance(kLinkFailureHold);
  controller_->Tick(clock_.Now());
  got = controller_->GetJob(j.id);
  EXPECT_NE(got->status().state(), v1::FAILED);
  EXPECT_EQ(got->status().restarts(), 0);
  EXPECT_EQ(FirstCounter(metrics, "gpipe_job_restarts_total"), 0);
}

// A LinkFailed with nothing after it restarts the job once its hold is
// over, counted.
TEST_F(ControllerStateTest, ALinkFailureAloneRestartsTheJobAfterItsHold) {
  TwoStageJob j = StartTwoStageJob(5);
  BreakLink(*j.w2, j.a2);
  clock_.Advance(kLinkFailureHold - absl::Milliseconds(1));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(j.id), v1::RUNNING);
  clock_.Advance(absl::Milliseconds(1));
  controller_->Tick(clock_.Now());
  absl::StatusOr<v1::Job> got = controller_->GetJob(j.id);
  EXPECT_EQ(got->status().state(), v1::RESTARTING);
  EXPECT_EQ(got->status().restarts(), 1);
  const v1::Condition* running = FindCondition(got->status(), kRunning);
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->reason(), "LinkFailed");
  EXPECT_NE(running->message().find("restart 1 of 5"), std::string::npos)
      << running->message();
  // The reporter's neighbour is held back until it beats, and says so.
  const auto held_back = [&](const std::string& id) {
    for (const v1::WorkerInfo& w : controller_->ListWorkers())
      if (w.worker_id() == id) return w.held_back();
    return std::string("not listed");
  };
  EXPECT_NE(held_back(j.w1->id()).find("since a neighbour's link to it broke"),
            std::string::npos)
      << held_back(j.w1->id());
  EXPECT_EQ(held_back(j.w2->id()), "");
  clock_.Advance(absl::Milliseconds(10));
  v1::WorkerMessage beat;
  beat.mutable_heartbeat();
  controller_->HandleMessage(*j.w1, beat);
  EXPECT_EQ(held_back(j.w1->id()), "");
}

// A full store reported after the hold ran out (a slow disk's error): the
// restart the link failure made is taken as the full store's, not counted.
TEST_F(ControllerStateTest, AFullStoreReportedAfterTheHoldIsNotCounted) {
  TwoStageJob j = StartTwoStageJob(5);
  BreakLink(*j.w2, j.a2);
  clock_.Advance(kLinkFailureHold);
  controller_->Tick(clock_.Now());
  absl::StatusOr<v1::Job> got = controller_->GetJob(j.id);
  ASSERT_EQ(got->status().restarts(), 1);
  controller_->HandleMessage(*j.w1, Failure(j.id, j.a1.epoch(), j.a1.stage(),
                                            "CheckpointStoreFull", kNoSpace));
  got = controller_->GetJob(j.id);
  EXPECT_EQ(got->status().restarts(), 0);
  const v1::Condition* running = FindCondition(got->status(), kRunning);
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->reason(), "CheckpointStoreFull");
  EXPECT_NE(running->message().find("could not write its checkpoint"),
            std::string::npos)
      << running->message();
  EXPECT_EQ(running->message().find("restart 1 of"), std::string::npos)
      << running->message();
}

// A controller's restart is a recovery like a lost worker: its jobs'
// return to RUNNING is observed in gpipe_recovery_duration_seconds.
TEST_F(ControllerStateTest, AControllerRestartIsObservedAsARecovery) {
  RestartOnStore(nullptr);
  OneStageJob j = StartOneStageJob();
  ASSERT_TRUE(j.a.has_value());
  controller_->HandleMessage(*j.w1, test_support::Progressed(*j.a, 1));

  ControllerMetrics metrics;
  RestartOnStore(&metrics);
  EXPECT_EQ(State(j.id), v1::RESTARTING);
  std::shared_ptr<WorkerRecord> w = Attach(3);
  Settle();
  ASSERT_TRUE(Assignment(*w).has_value());
  EXPECT_EQ(State(j.id), v1::RUNNING);
  uint64_t recoveries = 0;
  for (const auto& family : metrics.Collect()) {
    if (family.name != "gpipe_recovery_duration_seconds") continue;
    recoveries = family.metric.at(0).histogram.sample_count;
  }
  EXPECT_EQ(recoveries, 1u);
}

// A killed worker's neighbour often reports its broken link before the
// killed worker's own detach arrives: the job's restart is then said to be
// the lost worker's, not the healthy neighbour's.
TEST_F(ControllerStateTest, ALinkFailureIsBlamedOnTheNeighbourLostAfterIt) {
  TwoStageJob j = StartTwoStageJob(5);
  BreakLink(*j.w1, j.a1);
  auto running = [&] {
    absl::StatusOr<v1::Job> got = controller_->GetJob(j.id);
    const v1::Condition* c = FindCondition(got->status(), kRunning);
    return c == nullptr ? v1::Condition() : *c;
  };
  // A stopped worker's lease runs out seconds after the hold.
  clock_.Advance(kLinkFailureHold);
  controller_->Tick(clock_.Now());
  EXPECT_EQ(running().reason(), "LinkFailed");
  clock_.Advance(absl::Milliseconds(300));
  controller_->DetachWorker(*j.w2, absl::UnavailableError("stream ended"),
                            "the Attach stream ended");
  EXPECT_EQ(running().reason(), "WorkerLost");
  EXPECT_NE(running().message().find("worker w2 at 127.0.0.1:9002 was lost"),
            std::string::npos)
      << running().message();
  EXPECT_NE(running().message().find("restart 1 of 5"), std::string::npos)
      << running().message();
  absl::StatusOr<v1::Job> got = controller_->GetJob(j.id);
  EXPECT_EQ(got->status().restarts(), 1);  // one restart, not two
}

// A killed worker's closed stream arrives within the hold of its
// neighbour's LinkFailed: the restart is the lost worker's from the start.
TEST_F(ControllerStateTest, AWorkerLostWithinALinkFailuresHoldIsTheCause) {
  TwoStageJob j = StartTwoStageJob(5);
  BreakLink(*j.w1, j.a1);
  clock_.Advance(absl::Milliseconds(20));
  controller_->DetachWorker(*j.w2, absl::UnavailableError("stream ended"),
                            "the Attach stream ended");
  absl::StatusOr<v1::Job> got = controller_->GetJob(j.id);
  const v1::Condition* running = FindCondition(got->status(), kRunning);
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->reason(), "WorkerLost");
  EXPECT_NE(running->message().find("worker w2 at 127.0.0.1:9002 was lost"),
            std::string::npos)
      << running->message();
  clock_.Advance(kLinkFailureHold);
  controller_->Tick(clock_.Now());
  got = controller_->GetJob(j.id);
  EXPECT_EQ(got->status().restarts(), 1);  // one restart, not two
}

// A job whose data holds a NaN is failed at submit, before any worker
// gets a stage: off the lock, once the job is stored, its files are read
// as a stage would read them. A job whose data reads well then runs.
TEST_F(ControllerStateTest, DataThatAStageWouldRefuseFailsTheJobAtSubmit) {
  std::filesystem::create_directories(dir_);
  const auto spec = [&](bool poison) {
    std::vector<float> x(40 * 4, 0.5f);
    if (poison) x[7 * 4 + 2] = std::nanf("");
    std::vector<int64_t> y(40);
    for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>(i % 3);
    const std::string name = poison ? "bad" : "good";
    std::ofstream(dir_ / (name + "_x.npy"), std::ios::binary)
        << test_support::NpyFile(
               "<f4", "(40, 4)",
               std::string(reinterpret_cast<const char*>(x.data()),
                           x.size() * sizeof(float)));
    std::ofstream(dir_ / (name + "_y.npy"), std::ios::binary)
        << test_support::NpyFile(
               "<i8", "(40,)",
               std::string(reinterpret_cast<const char*>(y.data()),
                           y.size() * sizeof(int64_t)));
    absl::StatusOr<v1::JobSpec> parsed = ParseJobSpecJson(absl::StrCat(
        R"({"model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [4]}},
             "layers": [{"linear": {"in_features": 4, "out_features": 3}}],
             "loss": {"softmax_cross_entropy": {}}},
            "optimizer": {"lr": 0.1, "sgd": {}},
            "data": {"tensors": {"inputs": ")",
        (dir_ / (name + "_x.npy")).string(), R"(", "targets": ")",
        (dir_ / (name + "_y.npy")).string(), R"("}},
            "batch_size": 8, "steps": 4})"));
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return *parsed;
  };
  std::shared_ptr<WorkerRecord> w1 = Attach(1);
  absl::StatusOr<v1::Job> bad = controller_->SubmitJob(spec(true));
  ASSERT_TRUE(bad.ok()) << bad.status();
  const v1::Condition* checking = FindCondition(bad->status(), kScheduled);
  ASSERT_NE(checking, nullptr);
  EXPECT_EQ(checking->reason(), "CheckingData");
  EXPECT_FALSE(Assignment(*w1).has_value());  // not before the check
  controller_->FlushIo();
  absl::StatusOr<v1::Job> got = controller_->GetJob(bad->id());
  EXPECT_EQ(got->status().state(), v1::FAILED);
  const v1::Condition* failed = FindCondition(got->status(), kFailed);
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->reason(), "InvalidData");
  EXPECT_NE(failed->message().find("value nan is not finite"),
            std::string::npos)
      << failed->message();
  // Its Scheduled condition says it ended, not that it is still checking.
  checking = FindCondition(got->status(), kScheduled);
  ASSERT_NE(checking, nullptr);
  EXPECT_EQ(checking->reason(), "InvalidData");
  EXPECT_FALSE(Assignment(*w1).has_value());

  absl::StatusOr<v1::Job> good = controller_->SubmitJob(spec(false));
  ASSERT_TRUE(good.ok()) << good.status();
  controller_->FlushIo();
  EXPECT_TRUE(Assignment(*w1).has_value());
  EXPECT_EQ(State(good->id()), v1::RUNNING);
}

TEST_F(ControllerStateTest, ALeaseExpiresExactlyAtTheHeartbeatTimeout) {
  std::shared_ptr<WorkerRecord> w1 = Attach(1);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(Spec(1, 0));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Assignment(*w1).has_value());
  // A heartbeat at +8 s renews the lease until +18 s.
  clock_.Advance(absl::Seconds(8));
  v1::WorkerMessage beat;
  beat.mutable_heartbeat();
  controller_->HandleMessage(*w1, beat);
  clock_.Advance(absl::Seconds(10));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::RUNNING);
  EXPECT_EQ(disconnects_, 0);
  clock_.Advance(absl::Milliseconds(1));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::FAILED);
  EXPECT_EQ(disconnects_, 1);
  EXPECT_TRUE(controller_->ListWorkers().empty());
}

TEST_F(ControllerStateTest, ARestartingJobWaitsItsSettleTimeThenRestarts) {
  std::shared_ptr<WorkerRecord> w1 = Attach(1);
  std::shared_ptr<WorkerRecord> w2 = Attach(2);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(Spec(1, 1));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(Assignment(*w1).has_value());
  controller_->DetachWorker(*w1, absl::UnavailableError("gone"), "test");
  EXPECT_EQ(State(job->id()), v1::RESTARTING);
  // w2 is free, but the settle time (250 ms) has not passed.
  clock_.Advance(absl::Milliseconds(249));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::RESTARTING);
  EXPECT_FALSE(Assignment(*w2).has_value());
  clock_.Advance(absl::Milliseconds(1));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::RUNNING);
  std::optional<v1::Assignment> a = Assignment(*w2);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->epoch(), 2);
  EXPECT_EQ(a->start_step(), 0);
}

// An interleaved schedule runs on K workers of v chunks each: stage i on
// the (i % K)-th worker, whose one assignment carries its chunks with their
// own layers and neighbours (the last worker's chunks feed the first's
// next chunk). A stage's reports count only from the worker that runs it,
// and a checkpoint commits once every chunk wrote it. Short of workers past
// the grace period it runs on fewer (K' dividing M, each still with v
// chunks, the checkpoint restored by layer), and grows back at a
// checkpoint.
TEST_F(ControllerStateTest, TheInterleavedScheduleRunsChunksOnAGangOfWorkers) {
  std::shared_ptr<WorkerRecord> w1 = Attach(1);
  std::shared_ptr<WorkerRecord> w2 = Attach(2);
  v1::JobSpec spec = ChunkedSpec(2, v1::INTERLEAVED_1F1B, 2);
  spec.mutable_pipeline()->set_virtual_stages(2);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(State(job->id()), v1::RUNNING);
  std::optional<v1::Assignment> a[2] = {Assignment(*w1), Assignment(*w2)};
  ASSERT_TRUE(a[0].has_value() && a[1].has_value());
  // The message counts the spec's stages and their chunks, not 4 stages.
  {
    absl::StatusOr<v1::Job> got = controller_->GetJob(job->id());
    const v1::Condition* running = FindCondition(got->status(), kRunning);
    ASSERT_NE(running, nullptr);
    EXPECT_TRUE(absl::StartsWith(running->message(), "2 stages x 2 chunks,"))
        << running->message();
  }
  int64_t next_layer = 0;
  std::map<int64_t, v1::Assignment> by_stage;
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(a[w]->stage(), w);
    EXPECT_EQ(a[w]->stages(), 4);
    EXPECT_EQ(a[w]->spec().pipeline().virtual_stages(), 2);
    ASSERT_EQ(a[w]->chunks_size(), 2);
    for (int c = 0; c < 2; ++c) {
      const v1::Assignment& chunk = a[w]->chunks(c);
      EXPECT_EQ(chunk.stage(), w + 2 * c);
      EXPECT_FALSE(chunk.has_spec());  // the worker's assignment has it
      by_stage[chunk.stage()] = chunk;
    }
    EXPECT_EQ(a[w]->layer_begin(), a[w]->chunks(0).layer_begin());
  }
  for (const auto& [stage, chunk] : by_stage) {
    EXPECT_EQ(chunk.layer_begin(), next_layer) << stage;
    next_layer = chunk.layer_end();
    const std::string other =
        stage % 2 == 0 ? "127.0.0.1:9002" : "127.0.0.1:9001";
    EXPECT_EQ(chunk.upstream_address(), stage > 0 ? other : "") << stage;
    EXPECT_EQ(chunk.downstream_address(), stage < 3 ? other : "") << stage;
  }
  EXPECT_EQ(next_layer, 5);

  // Stage 2's report from w1 counts; from w2 (stage 3's worker) it does not.
  const int64_t ignored = controller_->ignored_reports();
  controller_->HandleMessage(*w2, test_support::Checkpointed(by_stage[2], 2));
  EXPECT_EQ(controller_->ignored_reports(), ignored + 1);
  for (int64_t stage : {0, 1, 2, 3}) {
    controller_->HandleMessage(stage % 2 == 0 ? *w1 : *w2,
                               test_support::Progressed(by_stage[stage], 2));
    controller_->HandleMessage(stage % 2 == 0 ? *w1 : *w2,
                               test_support::Checkpointed(by_stage[stage], 2));
  }
  EXPECT_EQ(controller_->ignored_reports(), ignored + 1);
  controller_->FlushIo();
  absl::StatusOr<v1::Job> got = controller_->GetJob(job->id());
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->status().checkpoints_size(), 1);
  EXPECT_EQ(got->status().stages_size(), 4);

  // w2 lost: within the grace period the job waits for a second worker;
  // after it, w1 runs every stage: K' = 1 worker x v = 2 chunks.
  controller_->DetachWorker(*w2, absl::UnavailableError("gone"), "test");
  clock_.Advance(absl::Milliseconds(500));
  controller_->Tick(clock_.Now());
  controller_->FlushIo();
  controller_->Tick(clock_.Now());
  EXPECT_NE(State(job->id()), v1::RUNNING);
  EXPECT_FALSE(Assignment(*w1).has_value());
  clock_.Advance(absl::Seconds(1));
  controller_->Tick(clock_.Now());
  controller_->FlushIo();
  controller_->Tick(clock_.Now());
  ASSERT_EQ(State(job->id()), v1::RUNNING);
  std::optional<v1::Assignment> alone = Assignment(*w1);
  ASSERT_TRUE(alone.has_value());
  EXPECT_EQ(alone->stages(), 2);
  ASSERT_EQ(alone->chunks_size(), 2);
  EXPECT_EQ(alone->chunks(0).layer_begin(), 0);
  EXPECT_EQ(alone->chunks(1).layer_end(), 5);
  EXPECT_EQ(alone->start_step(), 2);
  EXPECT_FALSE(alone->restore_manifest().empty());

  // A second worker again: the job grows back at its next checkpoint (an
  // older worker, which would run one chunk alone, is passed over).
  std::shared_ptr<WorkerRecord> old = Attach(4, /*runs_chunks=*/false);
  std::shared_ptr<WorkerRecord> w3 = Attach(3);
  for (const v1::Assignment& chunk : alone->chunks()) {
    v1::Assignment c = chunk;
    controller_->HandleMessage(*w1, test_support::Progressed(c, 4));
    controller_->HandleMessage(*w1, test_support::Checkpointed(c, 4));
  }
  controller_->FlushIo();
  clock_.Advance(absl::Seconds(1));
  controller_->Tick(clock_.Now());
  controller_->FlushIo();
  controller_->Tick(clock_.Now());
  ASSERT_EQ(State(job->id()), v1::RUNNING);
  std::optional<v1::Assignment> back[2] = {Assignment(*w1), Assignment(*w3)};
  ASSERT_TRUE(back[0].has_value() && back[1].has_value());
  EXPECT_EQ(back[0]->stages(), 4);
  EXPECT_EQ(back[1]->chunks_size(), 2);
  EXPECT_EQ(back[1]->start_step(), 4);
  got = controller_->GetJob(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status().restarts(), 1);  // growing back is not a restart
  EXPECT_FALSE(Assignment(*old).has_value());
}

// ZB-V on 3 workers: worker w's one assignment carries stages w and 5-w
// (the V), with their neighbours; a worker that runs chunks only round
// robin is passed over. Losing a worker, the job goes on with 2 past the
// grace period though 2 does not divide its M = 5 (only interleaving needs
// that).
// Each stage's worker is told the bubble the cost model predicts for the
// cut it runs: with one stage holding a single layer of the model's, the
// lighter stage idles beyond the schedule's theory by design.
TEST_F(ControllerStateTest, EachWorkerIsToldItsBubbleForTheCut) {
  std::shared_ptr<WorkerRecord> w[2] = {Attach(0), Attach(1)};
  v1::JobSpec spec = Spec(2, 2);
  const int64_t layers = spec.model().layers_size();
  ASSERT_GE(layers, 3);
  spec.mutable_pipeline()->clear_balance();
  spec.mutable_pipeline()->add_balance(1);
  spec.mutable_pipeline()->add_balance(layers - 1);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(State(job->id()), v1::RUNNING);
  const std::vector<double> want =
      CutBubbles(spec, ScheduleFromSpec(spec.pipeline().schedule()),
                 RematFromSpec(spec.pipeline().remat()), {1, layers - 1},
                 MicroBatchCount(spec), 1, spec.batch_size());
  ASSERT_EQ(want.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    std::optional<v1::Assignment> a = Assignment(*w[i]);
    ASSERT_TRUE(a.has_value()) << i;
    ASSERT_TRUE(a->has_predicted_bubble()) << i;
    EXPECT_EQ(a->predicted_bubble(), want[a->stage()]) << i;
  }
  EXPECT_GT(
      std::max(want[0], want[1]),
      TheoreticalBubbleRatio(2, MicroBatchCount(spec),
                             ScheduleFromSpec(spec.pipeline().schedule()), 1));
}

TEST_F(ControllerStateTest, ZeroBubbleVPlacesChunksInAVAndShrinksToAnyCount) {
  std::shared_ptr<WorkerRecord> old =
      Attach(9, /*runs_chunks=*/true, /*runs_zb_v=*/false);
  std::shared_ptr<WorkerRecord> w[3] = {Attach(0), Attach(1), Attach(2)};
  v1::JobSpec spec = ChunkedSpec(3, v1::ZERO_BUBBLE_V, 5);
  // 6 chunks need 6 layers at least.
  for (int i = 0; i < 2; ++i)
    spec.mutable_model()->add_layers()->mutable_relu();
  spec.set_batch_size(10);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(State(job->id()), v1::RUNNING);
  EXPECT_FALSE(Assignment(*old).has_value());
  const auto address = [](int64_t i) {
    return absl::StrCat("127.0.0.1:", 9000 + i);
  };
  std::vector<int64_t> first_ticks, balance(6, 0);
  std::vector<double> predicted(3, -1);
  for (int i = 0; i < 3; ++i) {
    std::optional<v1::Assignment> a = Assignment(*w[i]);
    ASSERT_TRUE(a.has_value()) << i;
    if (a->has_predicted_bubble()) predicted[i] = a->predicted_bubble();
    EXPECT_EQ(a->stage(), i);
    EXPECT_EQ(a->stages(), 6);
    ASSERT_EQ(a->chunks_size(), 2);
    EXPECT_EQ(a->chunks(0).stage(), i);
    EXPECT_EQ(a->chunks(1).stage(), 5 - i);
    // Every worker gets the same phase times for ZB-V's order (checked
    // against the cost model's for the cut below), three a stage.
    ASSERT_EQ(a->phase_ticks_size(), 3 * 6);
    if (i == 0) {
      first_ticks.assign(a->phase_ticks().begin(), a->phase_ticks().end());
    }
    EXPECT_EQ(
        std::vector<int64_t>(a->phase_ticks().begin(), a->phase_ticks().end()),
        first_ticks);
    for (const v1::Assignment& c : a->chunks())
      balance[c.stage()] = c.layer_end() - c.layer_begin();
    for (int64_t t : a->phase_ticks()) EXPECT_GE(t, 1);
    // Stage s's worker: s, or 5 - s on the way back.
    const auto worker_of = [](int64_t s) { return s < 3 ? s : 5 - s; };
    for (const v1::Assignment& c : a->chunks()) {
      const int64_t s = c.stage();
      EXPECT_EQ(c.upstream_address(), s > 0 ? address(worker_of(s - 1)) : "")
          << s;
      EXPECT_EQ(c.downstream_address(), s < 5 ? address(worker_of(s + 1)) : "")
          << s;
    }
  }
  const absl::StatusOr<ModelShapes> shapes = InferModelShapes(spec.model());
  ASSERT_TRUE(shapes.ok());
  std::vector<int64_t> expected;
  for (const PhaseTicks& t : CostModelTicks(
           *shapes, balance, RematFromSpec(spec.pipeline().remat()))) {
    expected.insert(expected.end(), {t.forward, t.input, t.weight});
  }
  EXPECT_EQ(first_ticks, expected);
  // Each worker's bubble for the cut, by the cost model, for its metrics.
  EXPECT_EQ(predicted, CutBubbles(spec, ScheduleKind::kZeroBubbleV,
                                  RematFromSpec(spec.pipeline().remat()),
                                  balance, 5, 2, 10));
  controller_->DetachWorker(*w[2], absl::UnavailableError("gone"), "test");
  clock_.Advance(absl::Milliseconds(1500));
  controller_->Tick(clock_.Now());
  controller_->FlushIo();
  controller_->Tick(clock_.Now());
  ASSERT_EQ(State(job->id()), v1::RUNNING);
  std::optional<v1::Assignment> a = Assignment(*w[0]);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->stages(), 4);
  ASSERT_EQ(a->chunks_size(), 2);
  EXPECT_EQ(a->chunks(1).stage(), 3);
  EXPECT_FALSE(Assignment(*old).has_value());
}

// Only workers that say they run chunks take an interleaved job; the job
// says what it waits for.
TEST_F(ControllerStateTest, AnInterleavedJobPassesOverOlderWorkers) {
  std::shared_ptr<WorkerRecord> w1 = Attach(1);
  std::shared_ptr<WorkerRecord> old = Attach(2, /*runs_chunks=*/false);
  v1::JobSpec spec = Spec(2, 2);
  spec.mutable_pipeline()->set_schedule(v1::INTERLEAVED_1F1B);
  spec.mutable_pipeline()->set_virtual_stages(2);
  spec.mutable_pipeline()->set_micro_batches(2);
  spec.mutable_pipeline()->clear_balance();
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(State(job->id()), v1::PENDING);
  EXPECT_FALSE(Assignment(*old).has_value());
  absl::StatusOr<v1::Job> got = controller_->GetJob(job->id());
  ASSERT_TRUE(got.ok());
  std::string waiting;
  for (const v1::Condition& c : got->status().conditions())
    if (c.type() == "Scheduled") waiting = c.message();
  EXPECT_NE(waiting.find("needs 2 workers, 1 free that run an interleaved "
                         "schedule's chunks (1 other is an older worker that "
                         "does not)"),
            std::string::npos)
      << waiting;
  std::shared_ptr<WorkerRecord> w3 = Attach(3);
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::RUNNING);
  EXPECT_TRUE(Assignment(*w1).has_value());
  EXPECT_TRUE(Assignment(*w3).has_value());
}

// Replicas run in one process so far: a cluster says so and keeps nothing.
// Replicas take K x R workers at once (a gang, never fewer: no elastic
// shrink); stage i of replica r runs on the (r * K + i)-th worker, with its
// pipeline neighbours in its own replica and its stage's other replicas
// named for the gradient sum. The step's loss is the replicas' micro-batch
// losses added in micro-batch order; replica 0 alone writes the parameters.
TEST_F(ControllerStateTest, ReplicasAreScheduledAsAGang) {
  std::vector<std::shared_ptr<WorkerRecord>> w;
  for (int i = 1; i <= 3; ++i) w.push_back(Attach(i));
  v1::JobSpec spec = Spec(2, 0);
  spec.set_batch_size(8);
  spec.mutable_pipeline()->set_micro_batches(4);
  spec.mutable_pipeline()->set_replicas(2);
  spec.mutable_pipeline()->set_min_stages(1);
  spec.mutable_pipeline()->set_elastic_grace_ms(1000);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  clock_.Advance(absl::Seconds(5));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::PENDING);
  absl::StatusOr<v1::Job> got = controller_->GetJob(job->id());
  ASSERT_TRUE(got.ok());
  const v1::Condition* scheduled = nullptr;
  for (const v1::Condition& c : got->status().conditions())
    if (c.type() == "Scheduled") scheduled = &c;
  ASSERT_NE(scheduled, nullptr);
  EXPECT_NE(scheduled->message().find(
                "needs 4 workers, 3 free (2 stages x 2 replicas)"),
            std::string::npos)
      << scheduled->message();

  w.push_back(Attach(4));
  controller_->Tick(clock_.Now());
  ASSERT_EQ(State(job->id()), v1::RUNNING);
  std::vector<v1::Assignment> a;
  for (auto& worker : w) {
    std::optional<v1::Assignment> next = Assignment(*worker);
    ASSERT_TRUE(next.has_value());
    a.push_back(*next);
  }
  for (int64_t slot = 0; slot < 4; ++slot) {
    const int64_t stage = slot % 2, replica = slot / 2;
    SCOPED_TRACE(testing::Message() << "slot " << slot);
    EXPECT_EQ(a[slot].stage(), stage);
    EXPECT_EQ(a[slot].replica(), replica);
    EXPECT_EQ(a[slot].replicas(), 2);
    ASSERT_EQ(a[slot].replica_addresses_size(), 2);
    EXPECT_EQ(a[slot].replica_addresses(0), w[stage]->info.address());
    EXPECT_EQ(a[slot].replica_addresses(1), w[2 + stage]->info.address());
    EXPECT_EQ(a[slot].downstream_address(),
              stage == 0 ? w[slot + 1]->info.address() : "");
    EXPECT_EQ(a[slot].upstream_address(),
              stage == 1 ? w[slot - 1]->info.address() : "");
  }
  got = controller_->GetJob(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status().running_replicas(), 2);
  ASSERT_EQ(got->status().stages_size(), 2);
  ASSERT_EQ(got->status().replica_stages_size(), 2);
  EXPECT_EQ(got->status().replica_stages(1).stage(), 1);
  EXPECT_EQ(got->status().replica_stages(1).replica(), 1);
  EXPECT_EQ(got->status().replica_stages(1).worker_id(), w[3]->id());

  // Step 1: each replica's last stage reports its two micro-batches.
  const auto progress = [&](int64_t slot, std::vector<double> losses) {
    v1::WorkerMessage m;
    v1::StepProgress& p = *m.mutable_progress();
    p.set_job_id(a[slot].job_id());
    p.set_epoch(a[slot].epoch());
    p.set_stage(a[slot].stage());
    p.set_replica(a[slot].replica());
    p.set_step(1);
    p.set_loss_normalizer(8);
    for (size_t i = 0; i < losses.size(); ++i) {
      v1::MicroBatchLoss* l = p.add_micro_batch_losses();
      l->set_micro_batch(a[slot].replica() * 2 + static_cast<int64_t>(i));
      l->set_loss_sum(losses[i]);
      l->set_counted(2);
    }
    controller_->HandleMessage(*w[slot], m);
  };
  progress(0, {});
  progress(2, {});
  progress(3, {0.3, 0.4});
  progress(1, {0.1, 0.2});
  got = controller_->GetJob(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status().step(), 1);
  EXPECT_EQ(got->status().loss(), (((0.0 + 0.1) + 0.2) + 0.3 + 0.4) / 8);

  // A report from replica 1's worker claiming replica 0 is fenced.
  v1::WorkerMessage forged;
  forged.mutable_finished()->set_job_id(a[3].job_id());
  forged.mutable_finished()->set_epoch(a[3].epoch());
  forged.mutable_finished()->set_stage(1);
  forged.mutable_finished()->set_replica(0);
  forged.mutable_finished()->set_parameters_path("/etc/passwd");
  controller_->HandleMessage(*w[3], forged);
  // Replicas 1 finish without a path; the job waits for replica 0.
  for (int64_t slot : {2, 3}) {
    v1::WorkerMessage m;
    v1::StageFinished& f = *m.mutable_finished();
    f.set_job_id(a[slot].job_id());
    f.set_epoch(a[slot].epoch());
    f.set_stage(a[slot].stage());
    f.set_replica(1);
    controller_->HandleMessage(*w[slot], m);
  }
  EXPECT_EQ(State(job->id()), v1::RUNNING);
  got = controller_->GetJob(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->status().state() == v1::FAILED);
}

// Elastic replicas: a lost worker of replica 1 cancels the epoch, the
// survivors say what they kept, and the job goes on from that step in
// memory with one replica (the holders), no checkpoint; two workers joining
// grow it back to two, replica 0 on the holders of the step they kept.
TEST_F(ControllerStateTest, ReplicasShrinkAndGrowBackFromMemory) {
  ReplicatedJob j = StartReplicatedJob();
  std::vector<std::shared_ptr<WorkerRecord>>& w = j.w;
  std::vector<v1::Assignment>& a = j.a;
  controller_->DetachWorker(*w[3], absl::UnavailableError("gone"), "test");
  EXPECT_EQ(State(j.id), v1::RESTARTING);
  Park(*w[0], a[0], 5);
  Park(*w[1], a[1], 5);
  EXPECT_EQ(State(j.id), v1::RESTARTING);  // w3 has not said yet
  Park(*w[2], a[2], 5);
  ASSERT_EQ(State(j.id), v1::RUNNING);
  absl::StatusOr<v1::Job> got = controller_->GetJob(j.id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status().running_replicas(), 1);
  EXPECT_TRUE(got->status().replica_stages().empty());
  for (int i : {0, 1}) {
    std::optional<v1::Assignment> next = Assignment(*w[i]);
    ASSERT_TRUE(next.has_value());
    EXPECT_TRUE(next->resume_in_memory());
    EXPECT_EQ(next->start_step(), 5);
    EXPECT_EQ(next->stage(), i);
    EXPECT_EQ(next->replicas(), 0);  // one replica
    a[i] = *next;
  }
  EXPECT_FALSE(Assignment(*w[2]).has_value());

  // Two workers join once the epoch has made a step: back to two replicas
  // from what replica 0 kept.
  for (int i : {0, 1}) {
    controller_->HandleMessage(*w[i], test_support::Progressed(a[i], 6));
  }
  w.push_back(Attach(5));
  w.push_back(Attach(6));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(j.id), v1::RESTARTING);
  Park(*w[0], a[0], 9);
  Park(*w[1], a[1], 9);
  ASSERT_EQ(State(j.id), v1::RUNNING);
  got = controller_->GetJob(j.id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status().running_replicas(), 2);
  EXPECT_EQ(got->status().stages(0).worker_id(), w[0]->id());
  EXPECT_EQ(got->status().stages(1).worker_id(), w[1]->id());
  std::optional<v1::Assignment> first = Assignment(*w[0]);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->resume_in_memory());
  EXPECT_EQ(first->start_step(), 9);
  EXPECT_EQ(first->replicas(), 2);
  EXPECT_FALSE(first->resume_roll_forward());
}

// A stage of a replica whose link broke reports it and parks at once, as
// its neighbours do: the parks that come while the LinkFailed is held are
// what the restart resumes from (they were dropped, and the job waited its
// parking time, then replayed from the checkpoint).
TEST_F(ControllerStateTest, ParksDuringALinkFailuresHoldResumeFromMemory) {
  ReplicatedJob j = StartReplicatedJob();
  std::vector<std::shared_ptr<WorkerRecord>>& w = j.w;
  std::vector<v1::Assignment>& a = j.a;
  BreakLink(*w[1], a[1]);
  clock_.Advance(absl::Milliseconds(5));
  for (size_t i = 0; i < w.size(); ++i) Park(*w[i], a[i], 5);
  EXPECT_EQ(State(j.id), v1::RUNNING);  // still held
  clock_.Advance(kLinkFailureHold);
  controller_->Tick(clock_.Now());
  // No parking wait: every stage had parked.
  ASSERT_EQ(State(j.id), v1::RUNNING);
  absl::StatusOr<v1::Job> got = controller_->GetJob(j.id);
  EXPECT_EQ(got->status().restarts(), 1);
  EXPECT_GT(got->status().epoch(), a[0].epoch());
  int in_memory = 0;
  for (auto& worker : w) {
    std::optional<v1::Assignment> next = Assignment(*worker);
    if (!next) continue;
    EXPECT_TRUE(next->resume_in_memory());
    EXPECT_EQ(next->start_step(), 5);
    ++in_memory;
  }
  EXPECT_GT(in_memory, 0);
}

// Replicas short of workers at the start wait the grace period for all
// of them, then, where the spec sets min_replicas, start with the replicas
// there are workers for; workers
// that come free while the new epoch still starts (no event of their own
// once it has) are taken on the lease thread's tick.
TEST_F(ControllerStateTest, ReplicasStartFewerAfterTheGraceAndGrowOnATick) {
  std::vector<std::shared_ptr<WorkerRecord>> w;
  for (int i = 1; i <= 3; ++i) w.push_back(Attach(i));
  v1::JobSpec spec = ReplicatedSpec();
  spec.mutable_pipeline()->set_min_replicas(1);  // a gang without it
  spec.mutable_pipeline()->set_elastic_grace_ms(2000);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  clock_.Advance(absl::Milliseconds(1999));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::PENDING);
  clock_.Advance(absl::Milliseconds(1));
  controller_->Tick(clock_.Now());
  ASSERT_EQ(State(job->id()), v1::RUNNING);
  absl::StatusOr<v1::Job> got = controller_->GetJob(job->id());
  EXPECT_EQ(got->status().running_replicas(), 1);
  std::vector<v1::Assignment> a;
  for (int i : {0, 1}) {
    std::optional<v1::Assignment> next = Assignment(*w[i]);
    ASSERT_TRUE(next.has_value());
    a.push_back(*next);
  }
  // A fourth worker joins before the epoch's first step: nothing to grow
  // from yet.
  w.push_back(Attach(4));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::RUNNING);
  for (int i : {0, 1}) {
    controller_->HandleMessage(*w[i], test_support::Progressed(a[i], 3));
  }
  clock_.Advance(absl::Milliseconds(100));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::RESTARTING);  // growing: parking first
  got = controller_->GetJob(job->id());
  EXPECT_EQ(got->status().restarts(), 0);  // a resize is no restart
}

TEST_F(ControllerStateTest, AShortJobRunsSmallerOnlyAfterItsGracePeriod) {
  std::shared_ptr<WorkerRecord> w1 = Attach(1);
  v1::JobSpec spec = Spec(2, 0);
  spec.mutable_pipeline()->set_min_stages(1);
  spec.mutable_pipeline()->set_elastic_grace_ms(3000);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(spec);
  ASSERT_TRUE(job.ok());
  clock_.Advance(absl::Milliseconds(2999));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::PENDING);
  clock_.Advance(absl::Milliseconds(1));
  controller_->Tick(clock_.Now());
  EXPECT_EQ(State(job->id()), v1::RUNNING);
  std::optional<v1::Assignment> a = Assignment(*w1);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->stages(), 1);
}

// The last stage finishes a step's backward before the first does: its
// loss waits until every stage has completed the step, so the job (and
// each watch event) never pairs step N with step N + 1's loss.
TEST_F(ControllerStateTest, AStepIsShownWithItsOwnLoss) {
  std::shared_ptr<WorkerRecord> w1 = Attach(1), w2 = Attach(2);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(Spec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  std::optional<v1::Assignment> x = Assignment(*w1), y = Assignment(*w2);
  ASSERT_TRUE(x.has_value() && y.has_value());
  const v1::Assignment& first = x->stage() == 0 ? *x : *y;
  const v1::Assignment& last = x->stage() == 0 ? *y : *x;
  WorkerRecord& on_first = x->stage() == 0 ? *w1 : *w2;
  WorkerRecord& on_last = x->stage() == 0 ? *w2 : *w1;
  const auto with_loss = [](const v1::Assignment& a, int64_t step, double loss,
                            double seconds) {
    v1::WorkerMessage m = test_support::Progressed(a, step);
    m.mutable_progress()->set_loss(loss);
    m.mutable_progress()->set_step_seconds(seconds);
    return m;
  };
  const auto status = [&] {
    absl::StatusOr<v1::Job> got = controller_->GetJob(job->id());
    EXPECT_TRUE(got.ok());
    return got->status();
  };
  controller_->HandleMessage(on_last, with_loss(last, 1, 2.0, 0.5));
  EXPECT_EQ(status().step(), 0);
  controller_->HandleMessage(on_first, test_support::Progressed(first, 1));
  EXPECT_EQ(status().step(), 1);
  EXPECT_EQ(status().loss(), 2.0);
  // Step 2's loss comes while the first stage is still at step 1.
  controller_->HandleMessage(on_last, with_loss(last, 2, 1.5, 0.25));
  EXPECT_EQ(status().step(), 1);
  EXPECT_EQ(status().loss(), 2.0);
  controller_->HandleMessage(on_last, with_loss(last, 3, 1.25, 0.25));
  controller_->HandleMessage(on_first, test_support::Progressed(first, 2));
  EXPECT_EQ(status().step(), 2);
  EXPECT_EQ(status().loss(), 1.5);
  EXPECT_EQ(status().samples_per_second(), Spec(2, 2).batch_size() / 0.25);
  controller_->HandleMessage(on_first, test_support::Progressed(first, 3));
  EXPECT_EQ(status().step(), 3);
  EXPECT_EQ(status().loss(), 1.25);
}

TEST_F(ControllerStateTest, CommitsAreVerifiedOffTheLockAndRestoredFrom) {
  OneStageJob j = StartOneStageJob();
  std::shared_ptr<WorkerRecord> w1 = j.w1, w2 = j.w2;
  const std::optional<v1::Assignment>& a = j.a;
  ASSERT_TRUE(a.has_value());
  controller_->HandleMessage(*w1, test_support::Progressed(*a, 2));
  controller_->HandleMessage(*w1, test_support::Checkpointed(*a, 2));
  // A report whose file does not match what it says is not committed.
  controller_->HandleMessage(*w1, test_support::Progressed(*a, 4));
  v1::WorkerMessage lying = test_support::Checkpointed(*a, 4);
  lying.mutable_checkpointed()->set_sha256(std::string(64, 'a'));
  controller_->HandleMessage(*w1, lying);
  controller_->FlushIo();
  absl::StatusOr<v1::Job> got = controller_->GetJob(j.id);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->status().checkpoints_size(), 1);
  EXPECT_EQ(got->status().checkpoints(0).step(), 2);

  // Lost: the restart checks step 2 off the lock, then restores it.
  std::optional<v1::Assignment> b = RestartOn(*w1, *w2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->start_step(), 2);
  EXPECT_EQ(b->restore_manifest(),
            got->status().checkpoints(0).manifest_path());
  EXPECT_EQ(controller_->corrupt_checkpoints(), 0);
}

// A worker that says goodbye (SIGTERM: a rollout, a node drain) is planned
// for: its job restarts on another worker without spending a restart. The
// job here allows none: a lost worker would fail it.
TEST_F(ControllerStateTest, ADrainedWorkerCostsTheJobNoRestart) {
  std::shared_ptr<WorkerRecord> w1 = Attach(1);
  std::shared_ptr<WorkerRecord> w2 = Attach(2);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(Spec(1, 0));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Assignment(*w1).has_value());
  controller_->DetachWorker(*w1, absl::OkStatus(), "it said goodbye (SIGTERM)",
                            /*drained=*/true);
  absl::StatusOr<v1::Job> got = controller_->GetJob(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status().state(), v1::RESTARTING);
  EXPECT_EQ(got->status().restarts(), 0);
  const v1::Condition* running = FindCondition(got->status(), kRunning);
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->reason(), "WorkerDrained");
  Settle();
  std::optional<v1::Assignment> b = Assignment(*w2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->job_id(), job->id());
  // Lost, not drained, the next one fails it.
  controller_->DetachWorker(*w2, absl::UnavailableError("gone"), "gone");
  got = controller_->GetJob(job->id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status().state(), v1::FAILED);
}

TEST_F(ControllerStateTest, ACorruptRestorePointIsDroppedAndCounted) {
  OneStageJob j = StartOneStageJob();
  std::shared_ptr<WorkerRecord> w1 = j.w1, w2 = j.w2;
  const std::optional<v1::Assignment>& a = j.a;
  ASSERT_TRUE(a.has_value());
  controller_->HandleMessage(*w1, test_support::Progressed(*a, 2));
  controller_->HandleMessage(*w1, test_support::Checkpointed(*a, 2));
  controller_->HandleMessage(*w1, test_support::Progressed(*a, 4));
  controller_->HandleMessage(*w1, test_support::Checkpointed(*a, 4));
  controller_->FlushIo();
  // Step 4's file changes after its commit.
  std::ofstream(
      storage::StageFilePath(storage::CheckpointStepDir(a->checkpoint_dir(), 4),
                             a->epoch(), 0),
      std::ios::binary)
      << "step 4, altered";
  std::optional<v1::Assignment> b = RestartOn(*w1, *w2);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->start_step(), 2);
  EXPECT_EQ(controller_->corrupt_checkpoints(), 1);
  absl::StatusOr<v1::Job> got = controller_->GetJob(j.id);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->status().checkpoints_size(), 1);
  EXPECT_EQ(got->status().checkpoints(0).step(), 2);
}

}  // namespace
}  // namespace gpipe::controller

namespace gpipe::controller {
namespace {

// Restarts: a spec that does not say gets kDefaultMaxRestarts; each restart
// without progress waits twice as long as the one before (0.25 s, 0.5 s,
// 1 s ...); a full checkpoint store waits without spending a restart.
class RestartPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ControllerOptions o;
    o.checkpoint_dir = (std::filesystem::temp_directory_path() /
                        absl::StrCat("restart_policy_test-", getpid()))
                           .string();
    o.clock = [this] { return clock_.Now(); };
    controller_ = std::make_unique<Controller>(o);
    for (int i = 0; i < 4; ++i) {
      v1::WorkerHello hello;
      hello.set_worker_id(absl::StrCat("w", i));
      hello.set_address(absl::StrCat("127.0.0.1:", 9100 + i));
      workers_.push_back(*controller_->AttachWorker(hello, "", [] {}));
    }
  }
  // The worker holding the job's stage now, if any.
  std::shared_ptr<WorkerRecord> Busy() {
    for (auto& w : workers_) {
      for (;;) {
        Outgoing out = controller_->NextMessage(*w, absl::ZeroDuration());
        if (!out.message.has_value()) break;
        if (out.message->has_assignment())
          busy_ = w, assignment_ = out.message->assignment();
      }
    }
    return busy_;
  }
  v1::JobStatus Status() { return controller_->GetJob(id_)->status(); }
  void Tick(absl::Duration d) {
    clock_.Advance(d);
    controller_->Tick(clock_.Now());
    controller_->FlushIo();
    controller_->Tick(clock_.Now());
  }

  FakeClock clock_;
  std::unique_ptr<Controller> controller_;
  std::vector<std::shared_ptr<WorkerRecord>> workers_;
  std::shared_ptr<WorkerRecord> busy_;
  v1::Assignment assignment_;
  std::string id_;
};

TEST_F(RestartPolicyTest, DefaultRestartsWithAGrowingBackoff) {
  v1::JobSpec spec = test_support::ControllerSpec(1);
  ASSERT_FALSE(spec.has_max_restarts());
  id_ = controller_->SubmitJob(spec)->id();
  ASSERT_NE(Busy(), nullptr);
  const absl::Duration waits[] = {absl::Milliseconds(250),
                                  absl::Milliseconds(500), absl::Seconds(1)};
  for (int i = 0; i < 3; ++i) {
    v1::WorkerMessage failed;
    failed.mutable_failed()->set_job_id(id_);
    failed.mutable_failed()->set_epoch(assignment_.epoch());
    failed.mutable_failed()->set_reason("CheckpointFailed");
    controller_->HandleMessage(*busy_, failed);
    EXPECT_EQ(Status().state(), v1::RESTARTING);
    EXPECT_EQ(Status().restarts(), i + 1);
    busy_ = nullptr;
    Tick(waits[i] - absl::Milliseconds(10));
    EXPECT_EQ(Busy(), nullptr) << "restart " << i + 1 << " came too soon";
    Tick(absl::Milliseconds(20));
    ASSERT_NE(Busy(), nullptr) << "restart " << i + 1 << " did not come";
    EXPECT_EQ(Status().state(), v1::RUNNING);
  }
  EXPECT_EQ(kDefaultMaxRestarts, 10);
}

TEST_F(RestartPolicyTest, AFullCheckpointStoreWaitsWithoutSpendingRestarts) {
  v1::JobSpec spec = test_support::RecoverableSpec(1, 1);
  id_ = controller_->SubmitJob(spec)->id();
  ASSERT_NE(Busy(), nullptr);
  for (int i = 0; i < 3; ++i) {
    v1::WorkerMessage failed;
    failed.mutable_failed()->set_job_id(id_);
    failed.mutable_failed()->set_epoch(assignment_.epoch());
    failed.mutable_failed()->set_reason("CheckpointStoreFull");
    failed.mutable_failed()->set_message("checkpoint: No space left on device");
    controller_->HandleMessage(*busy_, failed);
    EXPECT_EQ(Status().state(), v1::RESTARTING);
    busy_ = nullptr;
    Tick(absl::Seconds(2));  // the backoff grows all the same: 2 s covers 3
    ASSERT_NE(Busy(), nullptr);
  }
  EXPECT_EQ(Status().restarts(), 0);
  EXPECT_EQ(Status().state(), v1::RUNNING);
}

// Every worker beats (as live ones do) while the clock moves `d`.
void BeatFor(Controller& c, FakeClock& clock,
             const std::vector<std::shared_ptr<WorkerRecord>>& workers,
             absl::Duration d, const WorkerRecord* silent = nullptr) {
  v1::WorkerMessage beat;
  beat.mutable_heartbeat();
  for (absl::Duration t; t < d; t += absl::Milliseconds(500)) {
    clock.Advance(absl::Milliseconds(500));
    for (const auto& w : workers) {
      if (w.get() != silent) c.HandleMessage(*w, beat);
    }
    c.Tick(clock.Now());
    c.FlushIo();
  }
}

// A stage that only sends heartbeats holds its job no longer than the stall
// timeout: the job restarts (counted, StageStalled) on another worker, and
// the silent one is quarantined.
TEST_F(RestartPolicyTest, AStalledStageRestartsTheJobElsewhere) {
  v1::JobSpec spec = test_support::ControllerSpec(1);
  spec.mutable_pipeline()->set_stall_timeout_ms(5000);
  id_ = controller_->SubmitJob(spec)->id();
  std::shared_ptr<WorkerRecord> stalled = Busy();
  ASSERT_NE(stalled, nullptr);
  BeatFor(*controller_, clock_, workers_, absl::Milliseconds(4500));
  EXPECT_EQ(Status().state(), v1::RUNNING);
  BeatFor(*controller_, clock_, workers_, absl::Seconds(2));
  EXPECT_EQ(Status().restarts(), 1);
  EXPECT_EQ(stalled->quarantines, 1);
  busy_ = nullptr;
  std::shared_ptr<WorkerRecord> next = Busy();
  ASSERT_NE(next, nullptr);
  EXPECT_NE(next->id(), stalled->id());
  EXPECT_GT(stalled->quarantined_until, clock_.Now());
}

// A stage whose link failed names no culprit; its neighbours get no stage
// until they prove alive, so a stopped process that still holds its lease
// is not given the next epoch.
TEST_F(RestartPolicyTest, ALinkFailureSuspendsTheNeighboursUntilTheyBeat) {
  id_ = controller_->SubmitJob(test_support::ControllerSpec(2))->id();
  Busy();
  std::shared_ptr<WorkerRecord> stage0, stage1;
  const v1::JobStatus first = Status();
  for (const v1::StageStatus& s : first.stages()) {
    for (const auto& w : workers_) {
      if (w->id() == s.worker_id()) (s.stage() == 0 ? stage0 : stage1) = w;
    }
  }
  ASSERT_NE(stage0, nullptr);
  ASSERT_NE(stage1, nullptr);
  v1::WorkerMessage failed;
  failed.mutable_failed()->set_job_id(id_);
  failed.mutable_failed()->set_epoch(Status().epoch());
  failed.mutable_failed()->set_stage(0);
  failed.mutable_failed()->set_reason("LinkFailed");
  controller_->HandleMessage(*stage0, failed);
  // stage 1's worker is stopped: it sends nothing.
  BeatFor(*controller_, clock_, workers_, absl::Seconds(2), stage1.get());
  const v1::JobStatus now = Status();
  EXPECT_EQ(now.state(), v1::RUNNING);
  for (const v1::StageStatus& s : now.stages()) {
    EXPECT_NE(s.worker_id(), stage1->id());
  }
}

// A loss that is not finite on stage 1, reported after stage 0's lost link
// (its neighbour closed it) made the job restart: the permanent failure of
// the epoch the job just left ends it, as the replay would fail alike.
TEST_F(RestartPolicyTest, APermanentFailureOfTheEpochJustLeftEndsTheJob) {
  v1::WorkerMessage link;
  link.mutable_failed()->set_reason("LinkFailed");
  link.mutable_failed()->set_message("the neighbouring stage closed the link");
  v1::WorkerMessage loss;
  loss.mutable_failed()->set_stage(1);
  loss.mutable_failed()->set_reason("LossNotFinite");
  loss.mutable_failed()->set_permanent(true);
  loss.mutable_failed()->set_message("loss is not finite (nan) at step 1");
  const auto failed_for_the_loss = [&] {
    const v1::JobStatus s = Status();
    const v1::Condition* failed = nullptr;
    for (const v1::Condition& c : s.conditions())
      if (c.type() == "Failed" && c.status()) failed = &c;
    return s.state() == v1::FAILED && failed != nullptr &&
           failed->reason() == "LossNotFinite" &&
           failed->message().find("loss is not finite (nan)") !=
               std::string::npos;
  };
  // `restarts` lost links, each followed by the restart, then the loss of
  // the epoch `back` epochs before the current one.
  const auto run = [&](int restarts, bool restart_last, int back) {
    id_ = controller_->SubmitJob(test_support::ControllerSpec(2))->id();
    Busy();
    const int64_t first = Status().epoch();
    link.mutable_failed()->set_job_id(id_);
    loss.mutable_failed()->set_job_id(id_);
    for (int r = 0; r < restarts; ++r) {
      link.mutable_failed()->set_epoch(Status().epoch());
      link.mutable_failed()->set_stage(assignment_.stage());
      controller_->HandleMessage(*busy_, link);
      // Held for its cause, then restarted (waiting out the backoff).
      EXPECT_EQ(Status().state(), v1::RUNNING);
      BeatFor(*controller_, clock_, workers_, kLinkFailureHold);
      EXPECT_EQ(Status().state(), v1::RESTARTING);
      if (r + 1 < restarts || restart_last) {
        // Past the backoff, with every worker alive (the neighbours of a
        // lost link wait for a beat).
        BeatFor(*controller_, clock_, workers_, absl::Seconds(1 << r));
        busy_ = nullptr;
        Busy();
        EXPECT_EQ(Status().state(), v1::RUNNING);
      }
    }
    EXPECT_EQ(Status().epoch(),
              first + (restart_last ? restarts : restarts - 1));
    loss.mutable_failed()->set_epoch(Status().epoch() - back);
    controller_->HandleMessage(*busy_, loss);
  };
  // While the job waits to restart after the lost link: the same epoch.
  run(1, /*restart_last=*/false, 0);
  EXPECT_TRUE(failed_for_the_loss());
  // After it restarted: the epoch before.
  run(1, /*restart_last=*/true, 1);
  EXPECT_TRUE(failed_for_the_loss());
  // Two epochs back says nothing about this one.
  run(2, /*restart_last=*/true, 2);
  EXPECT_EQ(Status().state(), v1::RUNNING);
}

// Ended jobs go once their retention has passed (running ones stay).
TEST_F(RestartPolicyTest, EndedJobsAreDeletedAfterTheirRetention) {
  id_ = controller_->SubmitJob(test_support::ControllerSpec(1))->id();
  ASSERT_TRUE(controller_->CancelJob(id_).ok());
  const std::string running =
      controller_->SubmitJob(test_support::ControllerSpec(1))->id();
  BeatFor(*controller_, clock_, workers_, absl::Seconds(5));
  EXPECT_TRUE(controller_->GetJob(id_).ok());
  // The default retention is a week; the clock jumps past it (the workers'
  // leases run out on the way, which a running job survives by restarting).
  clock_.Advance(absl::Hours(24 * 7) + absl::Seconds(1));
  controller_->Tick(clock_.Now());
  EXPECT_TRUE(absl::IsNotFound(controller_->GetJob(id_).status()));
  EXPECT_TRUE(controller_->GetJob(running).ok());
}

TEST_F(ControllerStateTest, AWorkerIdBelongsToItsClientCertificate) {
  v1::WorkerHello hello;
  hello.set_worker_id("bound");
  hello.set_address("127.0.0.1:9100");
  hello.set_session_key("the-workers-key");
  const std::string mine = "-----BEGIN CERTIFICATE-----\nworker\n";
  const std::string theirs = "-----BEGIN CERTIFICATE-----\nclient\n";
  ASSERT_TRUE(controller_->AttachWorker(hello, mine, [] {}).ok());
  // The right key from another certificate (or none): refused, and the
  // worker stays.
  for (const std::string& cert : {theirs, std::string()}) {
    absl::StatusOr<std::shared_ptr<WorkerRecord>> other =
        controller_->AttachWorker(hello, cert, [] {});
    EXPECT_TRUE(absl::IsAlreadyExists(other.status())) << other.status();
    EXPECT_NE(other.status().message().find("another client certificate"),
              std::string::npos);
  }
  // The worker itself, again: replaces its old stream.
  absl::StatusOr<std::shared_ptr<WorkerRecord>> again =
      controller_->AttachWorker(hello, mine, [] {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->certificate, mine);
}

// A step as long as the slow (6x) stage's layers run serially, so the
// layer times never add up to more than their step (the balancer ignores
// times that do).
constexpr double kStepSeconds = 0.25;

// The self-balancing pipeline on the state machine: stages report layer
// times, and at a committed checkpoint past the warm-up a job whose stage
// 1 is slow restarts (uncounted) from that checkpoint under a new cut.
class RebalanceTest : public ControllerStateTest {
 protected:
  v1::JobSpec RebalancingSpec() {
    v1::JobSpec spec = test_support::RecoverableSpec(2, 3);
    spec.set_steps(200);
    spec.mutable_checkpoint()->set_every(10);
    spec.mutable_pipeline()->mutable_rebalance()->set_after_steps(10);
    spec.mutable_pipeline()->mutable_rebalance()->set_every_steps(50);
    return spec;
  }
  // Progress of step `step` for the stage of `a`: each of its layers takes
  // `layer_ms` forward and twice that backward.
  v1::WorkerMessage Progress(const v1::Assignment& a, int64_t step,
                             double layer_ms) {
    v1::WorkerMessage m;
    v1::StepProgress& p = *m.mutable_progress();
    p.set_job_id(a.job_id());
    p.set_epoch(a.epoch());
    p.set_stage(a.stage());
    p.set_step(step);
    const int64_t layers = a.layer_end() - a.layer_begin();
    for (int64_t l = 0; l < layers; ++l) {
      p.add_layer_forward_seconds(layer_ms * 1e-3);
      p.add_layer_backward_seconds(2 * layer_ms * 1e-3);
    }
    p.set_busy_seconds(4 * 3 * layer_ms * 1e-3 * static_cast<double>(layers));
    p.set_step_seconds(kStepSeconds);
    return m;
  }
  // Steps (from, to] on both stages, stage 1's layers `slow` times as
  // expensive, then the checkpoint of step `to`, committed.
  void Run(const v1::Assignment& a0, const v1::Assignment& a1, WorkerRecord& w0,
           WorkerRecord& w1, int64_t from, int64_t to, double slow) {
    for (int64_t s = from + 1; s <= to; ++s) {
      controller_->HandleMessage(w0, Progress(a0, s, 1.0));
      controller_->HandleMessage(w1, Progress(a1, s, slow));
    }
    controller_->HandleMessage(w0, test_support::Checkpointed(a0, to));
    controller_->HandleMessage(w1, test_support::Checkpointed(a1, to));
    controller_->FlushIo();
  }
  v1::JobStatus Status(const std::string& id) {
    return controller_->GetJob(id)->status();
  }
};

// Once every stage has sent its layer times, the controller simulates the
// running cut on them: each worker is told the bubble its stage's measured
// times explain (replacing the cost model's), and the status shows them.
TEST_F(RebalanceTest, TheCutsBubbleComesFromTheStagesMeasuredTimes) {
  std::shared_ptr<WorkerRecord> w1 = Attach(1), w2 = Attach(2);
  v1::JobSpec spec = RebalancingSpec();
  spec.mutable_pipeline()->mutable_rebalance()->set_after_steps(1000);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  std::optional<v1::Assignment> a0 = Assignment(*w1), a1 = Assignment(*w2);
  ASSERT_TRUE(a0 && a1);
  const auto cut_bubble = [&](WorkerRecord& w) -> std::optional<double> {
    std::optional<double> last;
    for (;;) {
      Outgoing out = controller_->NextMessage(w, absl::ZeroDuration());
      if (!out.message.has_value()) return last;
      if (out.message->has_cut_bubble()) {
        EXPECT_EQ(out.message->cut_bubble().job_id(), job->id());
        EXPECT_EQ(out.message->cut_bubble().epoch(), a0->epoch());
        last = out.message->cut_bubble().predicted_bubble();
      }
    }
  };
  // Too few reports: the cost model's bubble stands.
  Run(*a0, *a1, *w1, *w2, 0, 10, 6.0);
  EXPECT_EQ(Status(job->id()).cut_bubbles_size(), 0);
  EXPECT_FALSE(cut_bubble(*w1).has_value());
  // Stage 1's layers cost 6x stage 0's: stage 0's worker idles most of
  // the step, by the times measured.
  Run(*a0, *a1, *w1, *w2, 10, 20, 6.0);
  const v1::JobStatus s = Status(job->id());
  ASSERT_EQ(s.cut_bubbles_size(), 2);
  EXPECT_GT(s.cut_bubbles(0), 0.5);
  EXPECT_LT(s.cut_bubbles(1), s.cut_bubbles(0));
  const std::optional<double> b1 = cut_bubble(*w1), b2 = cut_bubble(*w2);
  ASSERT_TRUE(b1 && b2);
  EXPECT_EQ(*b1, s.cut_bubbles(0));
  EXPECT_EQ(*b2, s.cut_bubbles(1));
  // The same times again: nothing new to tell the workers.
  Run(*a0, *a1, *w1, *w2, 20, 40, 6.0);
  EXPECT_FALSE(cut_bubble(*w1).has_value());
  // A restart drops them: the next epoch starts from the cost model's.
  controller_->HandleMessage(
      *w2, Failure(job->id(), a1->epoch(), 1, "Internal", "boom"));
  const v1::JobStatus again = Status(job->id());
  EXPECT_EQ(again.state(), v1::RESTARTING);
  EXPECT_EQ(again.cut_bubbles_size(), 0);
}

// Each of R replicas runs M / R of the step's micro-batches: the cut's
// bubble by the measured times is that pipeline's, larger than the same
// cut's with all M (it read M's: 20% for K=2, M=4, R=2, not 33%).
TEST_F(RebalanceTest, AReplicasCutBubbleIsForItsShareOfTheMicroBatches) {
  std::shared_ptr<WorkerRecord> w[4] = {Attach(1), Attach(2), Attach(3),
                                        Attach(4)};
  const auto bubbles = [&](int64_t replicas) {
    v1::JobSpec spec = RebalancingSpec();
    spec.mutable_pipeline()->mutable_rebalance()->set_after_steps(1000);
    spec.mutable_pipeline()->set_replicas(replicas);
    absl::StatusOr<v1::Job> job = controller_->SubmitJob(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return std::vector<double>();
    // Replica 0's stages and their workers.
    std::optional<v1::Assignment> a[2];
    WorkerRecord* on[2] = {nullptr, nullptr};
    for (auto& worker : w) {
      std::optional<v1::Assignment> got = Assignment(*worker);
      if (got && got->replica() == 0) {
        on[got->stage()] = worker.get();
        a[got->stage()] = got;
      }
    }
    EXPECT_TRUE(a[0] && a[1]);
    if (!a[0] || !a[1]) return std::vector<double>();
    Run(*a[0], *a[1], *on[0], *on[1], 0, 20, 1.0);
    const v1::JobStatus s = Status(job->id());
    EXPECT_TRUE(controller_->CancelJob(job->id()).ok());
    return std::vector<double>(s.cut_bubbles().begin(), s.cut_bubbles().end());
  };
  const std::vector<double> one = bubbles(1), two = bubbles(2);
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(two.size(), 2u);
  for (int i = 0; i < 2; ++i) EXPECT_GT(two[i], one[i] + 0.05) << i;
}

TEST_F(RebalanceTest, ASlowWorkerGivesUpLayersAtACheckpointAndTheJobSettles) {
  std::shared_ptr<WorkerRecord> w1 = Attach(1), w2 = Attach(2);
  absl::StatusOr<v1::Job> job = controller_->SubmitJob(RebalancingSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  std::optional<v1::Assignment> a0 = Assignment(*w1), a1 = Assignment(*w2);
  ASSERT_TRUE(a0 && a1);
  const int64_t old_cut = a0->layer_end();

  // Before after_steps nothing moves, whatever the stages measure.
  Run(*a0, *a1, *w1, *w2, 0, 10, 1.0);
  EXPECT_EQ(Status(job->id()).state(), v1::RUNNING);
  // Balanced after the warm-up: still nothing.
  Run(*a0, *a1, *w1, *w2, 10, 20, 1.0);
  EXPECT_EQ(Status(job->id()).state(), v1::RUNNING);
  EXPECT_EQ(Status(job->id()).repartitions_size(), 0);
  // Stage 1 turns slow (6x): the next checkpoint proposes a new cut, the
  // one after agrees and the job re-partitions.
  Run(*a0, *a1, *w1, *w2, 20, 30, 6.0);
  EXPECT_EQ(Status(job->id()).state(), v1::RUNNING);
  Run(*a0, *a1, *w1, *w2, 30, 40, 6.0);
  v1::JobStatus s = Status(job->id());
  ASSERT_EQ(s.state(), v1::RESTARTING);
  EXPECT_EQ(s.restarts(), 0);  // not counted against max_restarts
  ASSERT_EQ(s.repartitions_size(), 1);
  const v1::Repartition& r = s.repartitions(0);
  EXPECT_EQ(r.step(), 40);
  EXPECT_EQ(r.old_balance(0), old_cut);
  EXPECT_GT(r.new_balance(0), old_cut);  // stage 1 gives layers up
  // The ReLUs on both stages tell the speeds apart: stage 1's worker is
  // the slow one, and it keeps just the head.
  EXPECT_EQ(r.reason(), "worker_speeds");
  EXPECT_EQ(r.new_balance(1), 1);
  EXPECT_LT(r.predicted_new_seconds(), 0.9 * r.predicted_old_seconds());
  EXPECT_DOUBLE_EQ(r.measured_old_seconds(), kStepSeconds);
  const v1::Condition* running = nullptr;
  for (const v1::Condition& c : s.conditions())
    if (c.type() == "Running") running = &c;
  ASSERT_NE(running, nullptr);
  EXPECT_EQ(running->reason(), "Rebalance");

  // The restart: the same workers in the chosen order, the new cut, from
  // the checkpoint of step 40.
  clock_.Advance(absl::Seconds(1));
  controller_->Tick(clock_.Now());
  controller_->FlushIo();
  controller_->Tick(clock_.Now());
  std::optional<v1::Assignment> b0 = Assignment(*w1), b1 = Assignment(*w2);
  ASSERT_TRUE(b0 && b1);
  EXPECT_EQ(b0->layer_end(), r.new_balance(0));
  EXPECT_EQ(b1->layer_begin(), r.new_balance(0));
  EXPECT_EQ(b0->restore_step(), 40);
  EXPECT_EQ(b0->start_step(), 40);

  // The new cut runs at 40 ms a step: measured after ten steps or so.
  for (int64_t step = 41; step <= 55; ++step) {
    v1::WorkerMessage p0 = Progress(*b0, step, 1.0),
                      p1 = Progress(*b1, step, 6.0);
    p1.mutable_progress()->set_step_seconds(0.04);
    controller_->HandleMessage(*w1, p0);
    controller_->HandleMessage(*w2, p1);
  }
  EXPECT_NEAR(Status(job->id()).repartitions(0).measured_new_seconds(), 0.04,
              1e-9);

  // Measured as predicted, the new cut is the best there is: the job
  // settles there.
  v1::Assignment c0 = *b0, c1 = *b1;
  controller_->HandleMessage(*w1, test_support::Progressed(c0, 50));
  controller_->HandleMessage(*w1, test_support::Checkpointed(c0, 50));
  controller_->HandleMessage(*w2, test_support::Progressed(c1, 50));
  controller_->HandleMessage(*w2, test_support::Checkpointed(c1, 50));
  controller_->FlushIo();
  Run(c0, c1, *w1, *w2, 55, 80, 6.0);
  Run(c0, c1, *w1, *w2, 80, 140, 6.0);
  EXPECT_EQ(Status(job->id()).state(), v1::RUNNING);
  EXPECT_EQ(Status(job->id()).repartitions_size(), 1);
}

TEST_F(RebalanceTest, AnExplicitBalanceOrASwitchKeepsTheCut) {
  std::shared_ptr<WorkerRecord> w1 = Attach(1), w2 = Attach(2);
  v1::JobSpec off = RebalancingSpec();
  off.mutable_pipeline()->mutable_rebalance()->set_enabled(false);
  v1::JobSpec explicit_balance = RebalancingSpec();
  explicit_balance.mutable_pipeline()->add_balance(2);
  explicit_balance.mutable_pipeline()->add_balance(3);
  for (const v1::JobSpec& spec : {off, explicit_balance}) {
    absl::StatusOr<v1::Job> job = controller_->SubmitJob(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    std::optional<v1::Assignment> a0 = Assignment(*w1), a1 = Assignment(*w2);
    ASSERT_TRUE(a0 && a1);
    Run(*a0, *a1, *w1, *w2, 0, 30, 6.0);
    Run(*a0, *a1, *w1, *w2, 30, 40, 6.0);
    EXPECT_EQ(Status(job->id()).state(), v1::RUNNING);
    EXPECT_EQ(Status(job->id()).repartitions_size(), 0);
    ASSERT_TRUE(controller_->CancelJob(job->id()).ok());
  }
}

}  // namespace
}  // namespace gpipe::controller
