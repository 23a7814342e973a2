// The controller's rules around the balancer (controller/rebalance.h): what
// a progress report adds to a job's cost book, and when a committed
// checkpoint may move the layers (warm-up, every_steps, the steps left).
#include <limits>
#include <string>
#include <vector>

#include "controller/rebalance.h"
#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"
#include "tests/support/controller_fixtures.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;

// A step as long as the slow (6x) stage's layers run serially, so the
// layer times never add up to more than their step (the balancer ignores
// times that do).
constexpr double kStepSeconds = 0.25;

// A running 2-stage job of the fixture's 5 layers, cut 2,3 on w1 and w2.
JobRecord RunningJob(int64_t total_steps = 200) {
  JobRecord job;
  v1::JobSpec spec = test_support::RecoverableSpec(2, 3);
  spec.set_steps(total_steps);
  spec.mutable_checkpoint()->set_every(10);
  spec.mutable_pipeline()->mutable_rebalance()->set_every_steps(50);
  *job.job.mutable_spec() = spec;
  job.stages = 2;
  v1::JobStatus& s = job.status();
  s.set_state(v1::RUNNING);
  s.set_total_steps(total_steps);
  const int64_t ends[] = {2, 5};
  for (int i = 0; i < 2; ++i) {
    v1::StageStatus* st = s.add_stages();
    st->set_stage(i);
    st->set_worker_id(i == 0 ? "w1" : "w2");
    st->set_layer_begin(i == 0 ? 0 : 2);
    st->set_layer_end(ends[i]);
  }
  job.timed_reports.assign(2, 0);
  return job;
}

v1::StepProgress Progress(int64_t stage, int64_t step, int64_t layers,
                          double layer_ms) {
  v1::StepProgress p;
  p.set_stage(stage);
  p.set_step(step);
  for (int64_t l = 0; l < layers; ++l) {
    p.add_layer_forward_seconds(layer_ms * 1e-3);
    p.add_layer_backward_seconds(2 * layer_ms * 1e-3);
  }
  p.set_step_seconds(kStepSeconds);
  p.set_busy_seconds(0.04);
  return p;
}

// Steps (from, to]: stage 1's layers `slow` times stage 0's.
void Feed(JobRecord& job, int64_t from, int64_t to, double slow) {
  for (int64_t s = from + 1; s <= to; ++s) {
    ASSERT_TRUE(RecordStageTimes(job, "w1", 0, Progress(0, s, 2, 1.0)));
    ASSERT_TRUE(RecordStageTimes(job, "w2", 0, Progress(1, s, 3, slow)));
  }
  job.status().set_step(to);
}

int64_t NoMemoryLimit(const std::string&) { return 0; }

TEST(RebalanceRulesTest, AfterTheWarmUpASlowStageMoves) {
  JobRecord job = RunningJob();
  Feed(job, 0, 15, 6.0);
  std::string why;
  // after_steps (20) not reached: no question asked, nothing said.
  EXPECT_FALSE(
      PlanRepartition(job, 10, NoMemoryLimit, absl::Now(), &why).has_value());
  EXPECT_EQ(why, "");
  Feed(job, 15, 25, 6.0);
  // The first checkpoint that finds a better cut proposes it; the next
  // one that finds it too moves.
  EXPECT_FALSE(
      PlanRepartition(job, 20, NoMemoryLimit, absl::Now(), &why).has_value());
  EXPECT_NE(why.find("if the next checkpoint's estimates agree"),
            std::string::npos)
      << why;
  Feed(job, 25, 35, 6.0);
  const std::optional<v1::Repartition> r =
      PlanRepartition(job, 30, NoMemoryLimit, absl::Now(), &why);
  ASSERT_TRUE(r.has_value()) << why;
  EXPECT_EQ(r->step(), 30);
  EXPECT_GT(r->new_balance(0), 2);
  EXPECT_EQ(r->workers(0), "w1");
  EXPECT_DOUBLE_EQ(r->measured_old_seconds(), kStepSeconds);
  // A balanced job is told why it stays.
  JobRecord balanced = RunningJob();
  Feed(balanced, 0, 25, 1.0);
  EXPECT_FALSE(PlanRepartition(balanced, 20, NoMemoryLimit, absl::Now(), &why)
                   .has_value());
  EXPECT_EQ(why, "the running cut 2,3 on w1,w2 is the best");
}

// Noise makes consecutive checkpoints find different best cuts among
// several nearly as good: the job still moves, to the cut the earlier one
// proposed, when the later estimates predict it gains enough too; a
// proposal they no longer back waits for the next checkpoint.
TEST(RebalanceRulesTest, TwoCheckpointsNeedNotPickTheSameBestCut) {
  JobRecord job = RunningJob();
  Feed(job, 0, 25, 6.0);
  std::string why;
  ASSERT_FALSE(
      PlanRepartition(job, 20, NoMemoryLimit, absl::Now(), &why).has_value());
  ASSERT_EQ(job.proposed_balance, (std::vector<int64_t>{4, 1})) << why;
  const std::string reason = job.proposed_reason;
  EXPECT_FALSE(reason.empty());
  // As if the last checkpoint's estimates had found 3,2 best: it gains
  // too by these, so the job moves there.
  job.proposed_balance = {3, 2};
  Feed(job, 25, 35, 6.0);
  std::optional<v1::Repartition> r =
      PlanRepartition(job, 30, NoMemoryLimit, absl::Now(), &why);
  ASSERT_TRUE(r.has_value()) << why;
  EXPECT_EQ(
      std::vector<int64_t>(r->new_balance().begin(), r->new_balance().end()),
      (std::vector<int64_t>{3, 2}));
  EXPECT_LT(r->predicted_new_seconds(), r->predicted_old_seconds());
  EXPECT_EQ(r->reason(), reason);  // the proposal's own, not this best's

  // A proposal these estimates say gains nothing (the running cut's
  // mirror, 1,4): no move; this checkpoint's best is proposed instead and
  // moves at the next.
  JobRecord other = RunningJob();
  Feed(other, 0, 25, 6.0);
  ASSERT_FALSE(
      PlanRepartition(other, 20, NoMemoryLimit, absl::Now(), &why).has_value());
  other.proposed_balance = {1, 4};
  Feed(other, 25, 35, 6.0);
  EXPECT_FALSE(
      PlanRepartition(other, 30, NoMemoryLimit, absl::Now(), &why).has_value());
  EXPECT_NE(why.find("the cut 1,4 on w1,w2 proposed at the last checkpoint"),
            std::string::npos)
      << why;
  EXPECT_EQ(other.proposed_balance, (std::vector<int64_t>{4, 1}));
  Feed(other, 35, 45, 6.0);
  r = PlanRepartition(other, 40, NoMemoryLimit, absl::Now(), &why);
  ASSERT_TRUE(r.has_value()) << why;
  EXPECT_EQ(r->new_balance(0), 4);
}

// An interleaved schedule's chunks share workers (stage i on worker i % K):
// however slow a stage, the balancer proposes nothing for them, even when
// an elastic shrink left as many stages as the spec has workers.
TEST(RebalanceRulesTest, NeverForAnInterleavedSchedulesChunks) {
  JobRecord job = RunningJob();
  job.job.mutable_spec()->mutable_pipeline()->set_schedule(
      v1::INTERLEAVED_1F1B);
  job.job.mutable_spec()->mutable_pipeline()->set_virtual_stages(2);
  Feed(job, 0, 35, 6.0);
  std::string why;
  EXPECT_FALSE(
      PlanRepartition(job, 20, NoMemoryLimit, absl::Now(), &why).has_value());
  EXPECT_FALSE(
      PlanRepartition(job, 30, NoMemoryLimit, absl::Now(), &why).has_value());
  EXPECT_TRUE(job.proposed_balance.empty());
}

TEST(RebalanceRulesTest, AtMostOnceInEverySteps) {
  JobRecord job = RunningJob();
  v1::Repartition* before = job.status().add_repartitions();
  before->set_step(30);
  before->add_old_balance(1);
  before->add_old_balance(4);
  before->add_new_balance(2);
  before->add_new_balance(3);
  Feed(job, 30, 70, 6.0);
  std::string why;
  EXPECT_FALSE(
      PlanRepartition(job, 70, NoMemoryLimit, absl::Now(), &why).has_value());
  Feed(job, 70, 85, 6.0);
  EXPECT_FALSE(
      PlanRepartition(job, 80, NoMemoryLimit, absl::Now(), &why).has_value());
  EXPECT_TRUE(
      PlanRepartition(job, 90, NoMemoryLimit, absl::Now(), &why).has_value())
      << why;
}

TEST(RebalanceRulesTest, NotWhenTheStepsLeftDoNotRepayTheReplay) {
  JobRecord job = RunningJob(/*total_steps=*/40);
  Feed(job, 0, 39, 6.0);
  std::string why;
  EXPECT_FALSE(
      PlanRepartition(job, 20, NoMemoryLimit, absl::Now(), &why).has_value());
  EXPECT_NE(why.find("steps left"), std::string::npos) << why;
}

TEST(RebalanceRulesTest, NotWhenTheCutDoesNotFitItsWorkers) {
  JobRecord job = RunningJob();
  Feed(job, 0, 25, 6.0);
  std::string why;
  EXPECT_FALSE(PlanRepartition(
                   job, 20, [](const std::string&) -> int64_t { return 1; },
                   absl::Now(), &why)
                   .has_value());
  EXPECT_NE(why.find("does not fit"), std::string::npos) << why;
}

TEST(RebalanceRulesTest, ACutThatMeasuresSlowerIsUndoneOnce) {
  // The job moved from 2,3 on w1,w2 to 3,2 on w1,w2 at step 20, expecting
  // 40 ms; it measures 50 ms a step, slower than the 45 ms before.
  JobRecord job = RunningJob();
  job.status().mutable_stages(0)->set_layer_end(3);
  job.status().mutable_stages(1)->set_layer_begin(3);
  v1::Repartition* moved = job.status().add_repartitions();
  moved->set_step(20);
  for (int64_t b : {2, 3}) moved->add_old_balance(b);
  for (int64_t b : {3, 2}) moved->add_new_balance(b);
  for (const char* w : {"w1", "w2"}) {
    moved->add_old_workers(w);
    moved->add_workers(w);
  }
  moved->set_predicted_old_seconds(0.05);
  moved->set_predicted_new_seconds(0.04);
  moved->set_measured_old_seconds(0.045);
  job.measuring_repartition = true;
  for (int64_t s = 21; s <= 40; ++s) {
    ASSERT_TRUE(RecordStageTimes(job, "w1", 0, Progress(0, s, 3, 1.0)));
    ASSERT_TRUE(RecordStageTimes(job, "w2", 0, Progress(1, s, 2, 1.0)));
  }
  const std::optional<std::string> measured = MeasureRepartition(job);
  ASSERT_TRUE(measured.has_value());
  EXPECT_NE(measured->find("slower: back to 2,3"), std::string::npos)
      << *measured;
  EXPECT_TRUE(job.revert_pending);
  // At the next checkpoint, within every_steps of the move: back.
  std::string why;
  const std::optional<v1::Repartition> r =
      PlanRepartition(job, 30, NoMemoryLimit, absl::Now(), &why);
  ASSERT_TRUE(r.has_value()) << why;
  EXPECT_EQ(r->reason(), "revert");
  EXPECT_EQ(r->new_balance(0), 2);
  EXPECT_EQ(r->workers(1), "w2");
}

TEST(RebalanceRulesTest, ARestartedControllerKeepsMeasuringAndReverting) {
  JobRecord job = RunningJob();
  v1::Repartition* r = job.status().add_repartitions();
  r->set_reason("worker_speeds");
  r->add_old_balance(2);
  r->add_old_workers("w1");
  r->set_measured_old_seconds(0.05);
  RecoverRebalanceState(job);
  EXPECT_TRUE(job.measuring_repartition);  // not measured yet
  EXPECT_FALSE(job.revert_pending);
  r->set_measured_new_seconds(0.06);  // measured slower
  RecoverRebalanceState(job);
  EXPECT_FALSE(job.measuring_repartition);
  EXPECT_TRUE(job.revert_pending);
  r->set_reason("revert");  // a revert is never undone
  RecoverRebalanceState(job);
  EXPECT_FALSE(job.revert_pending);
}

TEST(RebalanceRulesTest, ACpuWorkersWarmUpReportIsNotSplit) {
  // Its first report carries no layer times (the warm-up step); with a
  // probe it is a CPU worker, so its busy time is not split as a GPU's.
  JobRecord job = RunningJob();
  ASSERT_TRUE(RecordStageTimes(job, "w1", 25.0, Progress(0, 1, 0, 0)));
  EXPECT_TRUE(job.layer_costs.seen().empty());
  EXPECT_EQ(job.timed_reports[0], 0);
}

TEST(RebalanceRulesTest, LayerTimesOfTheWrongLengthAreIgnored) {
  JobRecord job = RunningJob();
  EXPECT_FALSE(RecordStageTimes(job, "w1", 0, Progress(0, 1, 3, 1.0)));
  v1::StepProgress nan = Progress(0, 1, 2, 1.0);
  nan.set_layer_backward_seconds(1, std::numeric_limits<double>::quiet_NaN());
  EXPECT_FALSE(RecordStageTimes(job, "w1", 0, nan));
  v1::StepProgress huge = Progress(0, 1, 2, 1.0);
  huge.set_layer_forward_seconds(0, 1e300);
  EXPECT_FALSE(RecordStageTimes(job, "w1", 0, huge));
  EXPECT_TRUE(job.layer_costs.seen().empty());
}

TEST(RebalanceRulesTest, AStagesUpdateIsSplitOverItsLayersByParameters) {
  JobRecord job = RunningJob();
  v1::StepProgress p = Progress(1, 1, 3, 1.0);
  p.set_update_seconds(0.006);
  ASSERT_TRUE(RecordStageTimes(job, "w2", 0, p));
  const ModelShapes* shapes = job.model_shapes.get();
  ASSERT_NE(shapes, nullptr);
  int64_t params = 0;
  for (int64_t l = 2; l < 5; ++l) params += shapes->costs[l].param_bytes;
  ASSERT_GT(params, 0);
  double update = 0;
  for (const auto& [key, s] : job.layer_costs.seen()) {
    EXPECT_DOUBLE_EQ(s.update,
                     0.006 * shapes->costs[key.first].param_bytes / params);
    update += s.update;
  }
  EXPECT_NEAR(update, 0.006, 1e-15);
  v1::StepProgress bad = Progress(1, 2, 3, 1.0);
  bad.set_update_seconds(std::numeric_limits<double>::quiet_NaN());
  EXPECT_FALSE(RecordStageTimes(job, "w2", 0, bad));
}

TEST(RebalanceRulesTest, AStageWithoutLayerTimesIsSplitByTheCostModel) {
  // A GPU stage sends its busy time only.
  JobRecord job = RunningJob();
  v1::StepProgress p = Progress(1, 1, 0, 0);
  p.set_busy_seconds(0.09);
  p.set_update_seconds(0.01);  // once a step: not split per micro-batch
  ASSERT_TRUE(RecordStageTimes(job, "w2", 0, p));
  double forward = 0;
  for (const auto& [key, s] : job.layer_costs.seen()) {
    EXPECT_EQ(key.second, "w2");
    forward += s.forward;
  }
  EXPECT_EQ(job.layer_costs.seen().size(), 3u);
  // The last stage does not re-materialize: busy = M (F + 2F), M = 4.
  EXPECT_NEAR(forward, 0.08 / 4 / 3, 1e-12);
}

}  // namespace
}  // namespace gpipe::controller
