// Placement by memory: the first workers in attach order when they hold
// their stages, else the larger stages on the workers that hold them, and a
// job no worker could hold refused with its figures.
#include "controller/placement.h"
#include "gtest/gtest.h"

namespace gpipe::controller {
namespace {

StagePlan Plan(const std::vector<int64_t>& needs) {
  StagePlan plan;
  for (int64_t n : needs) {
    StageMemory m;
    m.activations = n;
    plan.memory.push_back(m);
    plan.balance.push_back(1);
  }
  return plan;
}

TEST(PlacementTest, AttachOrderWhenEveryStageFits) {
  std::string why;
  auto place = PlaceStages(Plan({10, 20}), {20, 20, 100}, &why);
  ASSERT_TRUE(place.has_value()) << why;
  EXPECT_EQ(*place, (std::vector<size_t>{0, 1}));
  // Unknown memory (0) holds anything.
  place = PlaceStages(Plan({10, 1000}), {0, 0}, &why);
  ASSERT_TRUE(place.has_value());
  EXPECT_EQ(*place, (std::vector<size_t>{0, 1}));
}

TEST(PlacementTest, LargerStagesGoToTheWorkersThatHoldThem) {
  std::string why;
  // Stage 0 needs 50: only worker 2 (60) or 3 (unknown) holds it; the
  // smallest that does is taken, and stage 1 gets the smallest left.
  auto place = PlaceStages(Plan({50, 10, 20}), {10, 20, 60, 0}, &why);
  ASSERT_TRUE(place.has_value()) << why;
  EXPECT_EQ(*place, (std::vector<size_t>{2, 0, 1}));
}

TEST(PlacementTest, NoFitSaysWhichStageNeedsWhat) {
  std::string why;
  EXPECT_FALSE(PlaceStages(Plan({10, int64_t{3} << 30}),
                           {int64_t{1} << 30, int64_t{2} << 30}, &why)
                   .has_value());
  EXPECT_EQ(why,
            "stage 1 needs 3.00 GiB (parameters 0 B, gradients 0 B, optimizer "
            "0 B, packed weights 0 B, activations 3.00 GiB, working 0 B, in "
            "flight 0 B, "
            "evaluation 0 B, batch 0 "
            "B, data 0 B), the largest "
            "free worker left has 2.00 GiB for stages");
  EXPECT_FALSE(PlaceStages(Plan({1, 1, 1}), {10, 10}, &why).has_value());
  EXPECT_EQ(why, "needs 3 workers, 2 free");
}

TEST(PlacementTest, ACheckAtSubmissionAgainstTheLargestWorker) {
  EXPECT_TRUE(CheckFitsCluster(Plan({10, 50}), {60, 10}).ok());
  EXPECT_TRUE(CheckFitsCluster(Plan({10, 50}), {}).ok());       // none yet
  EXPECT_TRUE(CheckFitsCluster(Plan({10, 50}), {40, 0}).ok());  // unknown
  const absl::Status refused = CheckFitsCluster(Plan({10, 50}), {40, 20});
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_NE(refused.message().find("stage 1 needs 50 B"), std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("the largest worker has 40 B for stages"),
            std::string::npos)
      << refused;
  EXPECT_NE(refused.message().find("more stages, micro-batches or "
                                   "re-materialization need less"),
            std::string::npos)
      << refused;
  // A stage whose evaluation batch outweighs its training step: the
  // evaluation's batch size is what to lower.
  StagePlan evaluating = Plan({10, 20});
  evaluating.memory[1].evaluation = 45;
  const absl::Status eval_refused = CheckFitsCluster(evaluating, {40, 20});
  EXPECT_NE(eval_refused.message().find(
                "its evaluation batch, 45 B, is more than its training step "
                "holds: a smaller eval.batchSize needs less"),
            std::string::npos)
      << eval_refused;
}

TEST(PlacementTest, PlansTheSpecsCutWithTheMemoryModel) {
  gpipe::v1::JobSpec spec;
  // PlanStages on a spec that does not validate reports the partitioner's
  // or the model's error rather than guessing.
  EXPECT_FALSE(PlanStages(spec, 2).ok());
}

}  // namespace
}  // namespace gpipe::controller
