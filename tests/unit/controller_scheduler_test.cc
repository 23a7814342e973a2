// The scheduler over a job table and a worker registry, with time passed in
// by the test (no threads, no sleeping): FIFO order, a big job holding back
// the small ones behind it (unless it needs more workers than are attached),
// restarting jobs before queued ones, the elastic grace period, the settle time
// of a restarting job, the restore point checked before a start and used up by
// it, and the assignments a start sends.
#include <memory>
#include <string>
#include <vector>

#include "controller/job_status.h"
#include "controller/job_table.h"
#include "controller/placement.h"
#include "controller/scheduler.h"
#include "controller/worker_registry.h"
#include "gtest/gtest.h"
#include "tests/support/controller_fixtures.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;

v1::JobSpec Spec(int64_t stages) {
  v1::JobSpec spec = test_support::ControllerSpec(stages);
  spec.mutable_pipeline()->set_schedule(v1::ONE_F_ONE_B);
  return spec;
}

class SchedulerTest : public ::testing::Test {
 protected:
  // `memory`: what its stages may hold (0: not said).
  std::shared_ptr<WorkerRecord> Attach(int i, int64_t memory = 0) {
    v1::WorkerHello hello;
    hello.set_worker_id("w" + std::to_string(i));
    hello.set_address("127.0.0.1:" + std::to_string(9000 + i));
    hello.mutable_resources()->set_memory_bytes(memory);
    absl::StatusOr<std::shared_ptr<WorkerRecord>> w = workers_.Add(hello, t0_);
    EXPECT_TRUE(w.ok()) << w.status();
    return *w;
  }
  JobRecord& Submit(const v1::JobSpec& spec) {
    return jobs_.Add(spec, spec.pipeline().stages(), now_);
  }
  // One pass at now_; the restore-point checks it asks for.
  std::vector<std::string> Schedule() {
    std::vector<std::string> asked;
    ScheduleJobs(jobs_, workers_, "/ckpt", v1::CHECKPOINT_TRANSPORT_SHARED_PATH,
                 now_, [&](JobRecord& job) { asked.push_back(job.id()); });
    return asked;
  }
  std::vector<v1::Assignment> Assignments(WorkerRecord& w) {
    std::vector<v1::Assignment> out;
    for (const v1::ControllerMessage& m : w.outbox) {
      if (m.has_assignment()) out.push_back(m.assignment());
    }
    return out;
  }

  const absl::Time t0_ = absl::FromUnixSeconds(1'700'000'000);
  absl::Time now_ = t0_;
  JobTable jobs_;
  WorkerRegistry workers_;
};

TEST_F(SchedulerTest, StartsAJobOnTheFirstFreeWorkersWithItsAssignments) {
  auto w1 = Attach(1), w2 = Attach(2), w3 = Attach(3);
  JobRecord& job = Submit(Spec(2));
  EXPECT_TRUE(Schedule().empty());
  EXPECT_EQ(job.status().state(), v1::RUNNING);
  EXPECT_EQ(job.status().epoch(), 1);
  EXPECT_FALSE(w1->idle());
  EXPECT_FALSE(w2->idle());
  EXPECT_TRUE(w3->idle());
  const std::vector<v1::Assignment> a0 = Assignments(*w1),
                                    a1 = Assignments(*w2);
  ASSERT_EQ(a0.size(), 1u);
  ASSERT_EQ(a1.size(), 1u);
  EXPECT_EQ(a0[0].stage(), 0);
  EXPECT_EQ(a1[0].stage(), 1);
  EXPECT_EQ(a0[0].layer_begin(), 0);
  EXPECT_EQ(a0[0].layer_end(), a1[0].layer_begin());
  EXPECT_EQ(a1[0].layer_end(), 5);
  EXPECT_EQ(a0[0].downstream_address(), "127.0.0.1:9002");
  EXPECT_EQ(a1[0].upstream_address(), "127.0.0.1:9001");
  EXPECT_EQ(a0[0].schedule(), v1::ONE_F_ONE_B);
  EXPECT_EQ(a0[0].remat(), v1::EXCEPT_LAST);  // the default, resolved
  EXPECT_EQ(a0[0].checkpoint_dir(), "/ckpt/" + job.id());
  EXPECT_EQ(a0[0].output_dir(), "/ckpt/" + job.id() + "/final");
  EXPECT_EQ(a0[0].restore_manifest(), "");
  EXPECT_FALSE(a0[0].stream_key().empty());
  EXPECT_EQ(a0[0].stream_key(), a1[0].stream_key());
}

// Strict FIFO where the head waits for busy workers: a job behind it that
// would fit the free ones waits too, so the big job is not starved.
TEST_F(SchedulerTest, ABigJobHoldsBackTheSmallOnesBehindIt) {
  auto w1 = Attach(1), w2 = Attach(2), w3 = Attach(3);
  JobRecord& first = Submit(Spec(2));
  JobRecord& big = Submit(Spec(2));
  JobRecord& small = Submit(Spec(1));
  Schedule();
  EXPECT_EQ(first.status().state(), v1::RUNNING);
  EXPECT_EQ(big.status().state(), v1::PENDING);
  EXPECT_EQ(small.status().state(), v1::PENDING);
  EXPECT_TRUE(w3->idle());
  const v1::Condition* waiting = FindCondition(small.status(), kScheduled);
  ASSERT_NE(waiting, nullptr);
  EXPECT_NE(waiting->message().find("queued behind " + big.id()),
            std::string::npos)
      << waiting->message();
  auto w4 = Attach(4);
  Schedule();
  EXPECT_EQ(big.status().state(), v1::RUNNING);
  EXPECT_EQ(small.status().state(), v1::PENDING);
}

// With no worker at all, the message says so (it read "0 are attached").
TEST_F(SchedulerTest, AJobWithNoWorkerAttachedSaysSo) {
  JobRecord& job = Submit(Spec(2));
  Schedule();
  EXPECT_EQ(job.status().state(), v1::PENDING);
  const v1::Condition* waiting = FindCondition(job.status(), kScheduled);
  ASSERT_NE(waiting, nullptr);
  EXPECT_EQ(waiting->message(),
            "needs 2 workers, 0 free (no worker is attached: it waits for "
            "some to join; jobs behind it that fit go first)");
}

// A job that needs more workers than are attached waits for more to join
// without holding the queue: with 3 attached, a 4-stage job stalled every
// job behind it, the workers idle, until it was cancelled. It still goes
// first once enough have joined.
TEST_F(SchedulerTest, AJobNeedingMoreWorkersThanAttachedHoldsNoOneBack) {
  auto w1 = Attach(1), w2 = Attach(2), w3 = Attach(3);
  JobRecord& huge = Submit(Spec(4));
  JobRecord& small = Submit(Spec(2));
  Schedule();
  EXPECT_EQ(huge.status().state(), v1::PENDING);
  EXPECT_EQ(small.status().state(), v1::RUNNING);
  const v1::Condition* waiting = FindCondition(huge.status(), kScheduled);
  ASSERT_NE(waiting, nullptr);
  EXPECT_EQ(waiting->message(),
            "needs 4 workers, 3 free (only 3 are attached: it waits for more "
            "to join; jobs behind it that fit go first)");
  // A fourth joins while two are busy: now it could run on the attached
  // workers, so it holds the queue, and a 1-stage job waits behind it.
  auto w4 = Attach(4);
  JobRecord& later = Submit(Spec(1));
  Schedule();
  EXPECT_EQ(huge.status().state(), v1::PENDING);
  EXPECT_EQ(later.status().state(), v1::PENDING);
  waiting = FindCondition(later.status(), kScheduled);
  ASSERT_NE(waiting, nullptr);
  EXPECT_NE(waiting->message().find("queued behind " + huge.id()),
            std::string::npos)
      << waiting->message();
}

// After a controller restart the workers attach one at a time: a job
// that was running holds the queue even while fewer are attached than it
// needs (a queued job took the first worker to come back).
TEST_F(SchedulerTest, ARestartingJobHoldsTheQueueWhileItsWorkersReturn) {
  JobRecord& running = Submit(Spec(2));
  JobRecord& queued = Submit(Spec(1));
  running.status().set_epoch(1);
  running.status().set_state(v1::RESTARTING);
  auto w1 = Attach(1);
  Schedule();
  EXPECT_EQ(queued.status().state(), v1::PENDING);
  EXPECT_TRUE(w1->idle());
  auto w2 = Attach(2);
  Schedule();
  EXPECT_EQ(running.status().state(), v1::RUNNING);
  EXPECT_EQ(queued.status().state(), v1::PENDING);
}

// A job that was running (RESTARTING, as every running job is after a
// controller restart) goes back onto workers before queued jobs, an older
// resumed one included: that one took the running job's workers.
TEST_F(SchedulerTest, ARestartingJobGoesBeforeTheQueue) {
  auto w1 = Attach(1), w2 = Attach(2);
  JobRecord& queued = Submit(Spec(2));
  JobRecord& running = Submit(Spec(2));
  queued.status().set_epoch(1);  // resumed: it ran before
  running.status().set_epoch(1);
  running.status().set_state(v1::RESTARTING);
  ASSERT_EQ(jobs_.Waiting().front(), &running);
  Schedule();
  EXPECT_EQ(running.status().state(), v1::RUNNING);
  EXPECT_EQ(queued.status().state(), v1::PENDING);
}

// What each stage of `spec` cut into its K stages needs (the memory model).
std::vector<int64_t> Needs(const v1::JobSpec& spec) {
  absl::StatusOr<StagePlan> plan = PlanStages(spec, spec.pipeline().stages());
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<int64_t> out;
  for (const StageMemory& m : plan->memory) out.push_back(m.total());
  return out;
}

TEST_F(SchedulerTest, StagesGoWhereTheirMemoryFits) {
  const v1::JobSpec spec = Spec(2);
  const std::vector<int64_t> need = Needs(spec);
  ASSERT_EQ(need.size(), 2u);
  const int64_t small = std::min(need[0], need[1]);
  const int64_t large = std::max(need[0], need[1]);
  ASSERT_LT(small, large);
  const size_t big_stage = need[0] > need[1] ? 0 : 1;
  // The first free worker holds only the smaller stage; in attach order the
  // larger stage would land on it when it is stage 0.
  auto w1 = Attach(1, small), w2 = Attach(2, small), w3 = Attach(3, large);
  JobRecord& job = Submit(spec);
  Schedule();
  ASSERT_EQ(job.status().state(), v1::RUNNING);
  ASSERT_EQ(Assignments(*w3).size(), 1u);
  EXPECT_EQ(Assignments(*w3)[0].stage(), static_cast<int64_t>(big_stage));
  EXPECT_EQ(job.status().stages(big_stage).worker_id(), "w3");
  // Neighbours are addressed as placed, not in attach order.
  EXPECT_EQ(job.status().stages(1 - big_stage).worker_id(), "w1");
  EXPECT_TRUE(w2->idle());
}

TEST_F(SchedulerTest, AJobWaitsWithTheFiguresWhenNoFreeWorkerHoldsAStage) {
  const v1::JobSpec spec = Spec(2);
  const std::vector<int64_t> need = Needs(spec);
  const int64_t small = std::min(need[0], need[1]);
  auto w1 = Attach(1, small), w2 = Attach(2, small);
  JobRecord& job = Submit(spec);
  Schedule();
  EXPECT_EQ(job.status().state(), v1::PENDING);
  EXPECT_TRUE(w1->idle());
  EXPECT_TRUE(w2->idle());
  const v1::Condition* waiting = FindCondition(job.status(), kScheduled);
  ASSERT_NE(waiting, nullptr);
  EXPECT_NE(waiting->message().find("needs"), std::string::npos);
  EXPECT_NE(waiting->message().find("the largest free worker left has"),
            std::string::npos)
      << waiting->message();
  // A worker large enough arrives: the job starts.
  Attach(3, std::max(need[0], need[1]));
  Schedule();
  EXPECT_EQ(job.status().state(), v1::RUNNING);
}

TEST_F(SchedulerTest, AShortJobRunsOnFewerStagesOnlyAfterItsGracePeriod) {
  Attach(1);
  v1::JobSpec spec = Spec(2);
  spec.mutable_pipeline()->set_min_stages(1);
  spec.mutable_pipeline()->set_elastic_grace_ms(5000);
  JobRecord& job = Submit(spec);
  Schedule();
  EXPECT_EQ(job.status().state(), v1::PENDING);
  now_ = t0_ + absl::Milliseconds(4999);
  Schedule();
  EXPECT_EQ(job.status().state(), v1::PENDING);
  now_ = t0_ + absl::Milliseconds(5000);
  Schedule();
  EXPECT_EQ(job.status().state(), v1::RUNNING);
  EXPECT_EQ(job.status().running_stages(), 1);
}

TEST_F(SchedulerTest, ARestartingJobWaitsForItsSettleTime) {
  Attach(1);
  JobRecord& job = Submit(Spec(1));
  job.status().set_state(v1::RESTARTING);
  job.not_before = t0_ + absl::Milliseconds(250);
  Schedule();
  EXPECT_EQ(job.status().state(), v1::RESTARTING);
  now_ = t0_ + absl::Milliseconds(250);
  Schedule();
  EXPECT_EQ(job.status().state(), v1::RUNNING);
}

TEST_F(SchedulerTest, TheRestorePointIsCheckedBeforeAStartAndUsedUpByIt) {
  auto w1 = Attach(1);
  JobRecord& job = Submit(Spec(1));
  job.status().set_state(v1::RESTARTING);
  job.status().set_epoch(3);
  v1::CheckpointRef* ref = job.status().add_checkpoints();
  ref->set_step(4);
  ref->set_manifest_path("/ckpt/j/step-4/MANIFEST.json");
  // Asked once; the job holds its place meanwhile.
  EXPECT_EQ(Schedule(), std::vector<std::string>{job.id()});
  EXPECT_EQ(job.restore_check, JobRecord::RestoreCheck::kChecking);
  EXPECT_TRUE(Schedule().empty());
  EXPECT_EQ(job.status().state(), v1::RESTARTING);
  EXPECT_TRUE(w1->idle());
  // The check found step 4 intact.
  job.restore_point = *ref;
  job.restore_check = JobRecord::RestoreCheck::kChecked;
  EXPECT_TRUE(Schedule().empty());
  EXPECT_EQ(job.status().state(), v1::RUNNING);
  EXPECT_EQ(job.status().epoch(), 4);
  EXPECT_EQ(job.status().step(), 4);
  const std::vector<v1::Assignment> a = Assignments(*w1);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].start_step(), 4);
  EXPECT_EQ(a[0].restore_manifest(), "/ckpt/j/step-4/MANIFEST.json");
  // Used up: a later restart checks again.
  EXPECT_EQ(job.restore_check, JobRecord::RestoreCheck::kNeeded);
  EXPECT_FALSE(job.restore_point.has_value());
}

TEST_F(SchedulerTest, ACheckThatFoundNothingIntactStartsFromTheBeginning) {
  auto w1 = Attach(1);
  JobRecord& job = Submit(Spec(1));
  job.status().set_state(v1::RESTARTING);
  job.status().add_checkpoints()->set_step(2);
  job.restore_check = JobRecord::RestoreCheck::kChecked;  // nullopt chosen
  Schedule();
  const std::vector<v1::Assignment> a = Assignments(*w1);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].start_step(), 0);
  EXPECT_EQ(a[0].restore_manifest(), "");
}

TEST_F(SchedulerTest, ExpiredLeasesAreThoseSilentForLongerThanTheTimeout) {
  auto w1 = Attach(1), w2 = Attach(2);
  w2->last_heartbeat = t0_ + absl::Seconds(3);
  EXPECT_TRUE(
      workers_.Expired(t0_ + absl::Seconds(10), absl::Seconds(10)).empty());
  std::vector<std::shared_ptr<WorkerRecord>> expired =
      workers_.Expired(t0_ + absl::Seconds(11), absl::Seconds(10));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]->id(), "w1");
}

TEST_F(SchedulerTest, JobTableKeepsEventsBoundedAndWaitingInOrder) {
  JobRecord& a = Submit(Spec(1));
  JobRecord& b = Submit(Spec(1));
  EXPECT_NE(a.id(), b.id());
  std::vector<JobRecord*> waiting = jobs_.Waiting();
  ASSERT_EQ(waiting.size(), 2u);
  EXPECT_EQ(waiting[0], &a);
  for (size_t i = 0; i < 2 * JobTable::kEventHistory; ++i) {
    jobs_.Publish(a, "event", now_);
  }
  EXPECT_EQ(a.events.size(), JobTable::kEventHistory);
  EXPECT_EQ(a.version, 2 * JobTable::kEventHistory);
  MarkTerminal(&a.status(), v1::CANCELLED, kCancelled, "UserRequested", "x",
               now_);
  jobs_.Publish(a, "cancelled", now_);
  EXPECT_EQ(a.events.size(), JobTable::kEndedEventHistory);
  EXPECT_EQ(jobs_.Waiting().size(), 1u);
}

}  // namespace
}  // namespace gpipe::controller
