// Where a job of replicas resumes after a loss: the newest step every stage
// still holds somewhere (outright, or one step back with its update pending
// and that step's total known), the lowest replica holding it; and how many
// replicas the free workers allow.
#include "controller/replica_resume.h"
#include "gtest/gtest.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;

v1::StageParked Kept(int64_t begin, int64_t end, int64_t replica, int64_t step,
                     bool pending = false, int64_t last_update = -1,
                     double squares = 0) {
  v1::StageParked p;
  p.set_layer_begin(begin);
  p.set_layer_end(end);
  p.set_replica(replica);
  p.set_step(step);
  p.set_pending_update(pending);
  p.set_last_update_step(last_update);
  p.set_last_update_squares(squares);
  return p;
}

const std::vector<std::pair<int64_t, int64_t>> kCut = {{0, 2}, {2, 5}};
bool Anyone(const std::string&) { return true; }

TEST(ReplicaResumeTest, TheNewestStepEveryStageHoldsFromTheLowestReplica) {
  std::map<std::string, v1::StageParked> parked = {
      {"a", Kept(0, 2, 1, 10)},
      {"b", Kept(2, 5, 1, 10)},
      {"c", Kept(0, 2, 2, 11)},
      {"d", Kept(2, 5, 0, 10)},
  };
  std::optional<MemoryResume> plan = PlanMemoryResume(kCut, parked, Anyone);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->step, 10);  // stage 1 holds nothing at 11
  EXPECT_EQ(plan->holders, (std::vector<std::string>{"a", "d"}));
  EXPECT_FALSE(plan->roll_forward_squares.has_value());
  // Without "d" (gone), "b" holds stage 1.
  plan = PlanMemoryResume(kCut, parked,
                          [](const std::string& id) { return id != "d"; });
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->holders, (std::vector<std::string>{"a", "b"}));
  // A stage nobody holds: no plan, the checkpoint it is.
  parked.erase("b");
  parked.erase("d");
  EXPECT_FALSE(PlanMemoryResume(kCut, parked, Anyone).has_value());
  // A worker that kept nothing says step -1, which is no step.
  parked["f"] = Kept(0, 2, 0, -1);
  parked["g"] = Kept(2, 5, 0, -1);
  EXPECT_FALSE(PlanMemoryResume(kCut, parked, Anyone).has_value());
  // Another cut's files do not count.
  parked["e"] = Kept(2, 4, 0, 10);
  EXPECT_FALSE(PlanMemoryResume(kCut, parked, Anyone).has_value());
}

// A cancel while the total climbed back up the pipeline: stage 1 applied
// step 7 (it reports the total), stage 0 kept step 7 pending.
TEST(ReplicaResumeTest, APendingStageRollsForwardWithAReportedTotal) {
  std::map<std::string, v1::StageParked> parked = {
      {"a", Kept(0, 2, 0, 7, /*pending=*/true, 6, 1.5)},
      {"b", Kept(2, 5, 0, 8, false, 7, 2.25)},
  };
  std::optional<MemoryResume> plan = PlanMemoryResume(kCut, parked, Anyone);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->step, 8);
  EXPECT_EQ(plan->holders, (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(plan->roll_forward_squares.has_value());
  EXPECT_EQ(*plan->roll_forward_squares, 2.25);
  // Nobody tells step 7's total: no step has both stages.
  parked["b"] = Kept(2, 5, 0, 8, false, -1, 0);
  EXPECT_FALSE(PlanMemoryResume(kCut, parked, Anyone).has_value());
  // An outright holder is preferred to one that must roll forward.
  parked = {{"a", Kept(0, 2, 0, 7, true, 6, 1.5)},
            {"c", Kept(0, 2, 1, 8, false, 7, 2.25)},
            {"b", Kept(2, 5, 0, 8, false, 7, 2.25)}};
  plan = PlanMemoryResume(kCut, parked, Anyone);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->holders, (std::vector<std::string>{"c", "b"}));
  EXPECT_FALSE(plan->roll_forward_squares.has_value());
}

// Down to the minimum, one replica at a time: 3 replicas share 4 groups
// as 1, 1, 2 (the same bits), but never more replicas than groups.
TEST(ReplicaResumeTest, ReplicasShrinkOneAtATimeDownToTheMinimum) {
  v1::JobSpec spec;
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->set_micro_batches(8);
  spec.mutable_pipeline()->set_replicas(4);
  EXPECT_EQ(ElasticReplicas(spec, 2, 8), 4);
  EXPECT_EQ(ElasticReplicas(spec, 2, 7), 3);
  EXPECT_EQ(ElasticReplicas(spec, 2, 5), 2);
  EXPECT_EQ(ElasticReplicas(spec, 2, 3), 1);
  EXPECT_EQ(ElasticReplicas(spec, 2, 1), 0);
  spec.mutable_pipeline()->set_min_replicas(2);
  EXPECT_EQ(ElasticReplicas(spec, 2, 3), 0);
  EXPECT_EQ(MinReplicas(spec), 2);
  spec.mutable_pipeline()->set_gradient_groups(2);
  spec.mutable_pipeline()->set_min_replicas(0);
  EXPECT_EQ(ElasticReplicas(spec, 2, 7), 2);  // 3 replicas of 2 groups: no
  EXPECT_EQ(MinReplicas(spec), 1);
  // ZB-H1 runs one group on each replica: 4 of 4 groups, or none.
  spec.mutable_pipeline()->set_gradient_groups(0);
  spec.mutable_pipeline()->set_schedule(v1::ZERO_BUBBLE_H1);
  EXPECT_EQ(ElasticReplicas(spec, 2, 8), 4);
  EXPECT_EQ(ElasticReplicas(spec, 2, 7), 0);
}

}  // namespace
}  // namespace gpipe::controller
