// The step plan: which steps checkpoint and evaluate, the one rule the
// stages, the reference trainer and the controller share; and the one
// conversion between the spec's schedule and remat enums and ours.
#include "services/pipeline/step_plan.h"

#include <vector>

#include "gtest/gtest.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"

namespace gpipe {
namespace {

std::vector<int64_t> Checkpointed(const StepPlan& plan) {
  std::vector<int64_t> out;
  for (int64_t done = -1; done <= plan.steps() + 2; ++done) {
    if (plan.CheckpointsAfter(done)) out.push_back(done);
  }
  return out;
}

std::vector<int64_t> Evaluated(const StepPlan& plan) {
  std::vector<int64_t> out;
  for (int64_t done = -1; done <= plan.steps() + 2; ++done) {
    if (plan.EvaluatesAfter(done)) out.push_back(done);
  }
  return out;
}

TEST(StepPlan, EveryNStepsButNeverAfterTheLast) {
  const StepPlan plan(/*steps=*/10, /*checkpoint_every=*/5,
                      /*eval_every=*/3);
  EXPECT_EQ(Checkpointed(plan), (std::vector<int64_t>{5}));
  EXPECT_EQ(Evaluated(plan), (std::vector<int64_t>{3, 6, 9}));
}

TEST(StepPlan, ZeroOrNegativeMeansNever) {
  EXPECT_TRUE(Checkpointed(StepPlan(10, 0, 0)).empty());
  EXPECT_TRUE(Evaluated(StepPlan(10, 0, -2)).empty());
  EXPECT_TRUE(Checkpointed(StepPlan(10, -1, 0)).empty());
}

TEST(StepPlan, FromSpec) {
  gpipe::v1::JobSpec spec;
  spec.set_steps(9);
  spec.mutable_checkpoint()->set_every(4);
  spec.mutable_eval()->set_every(1);
  const StepPlan plan = StepPlan::FromSpec(spec);
  EXPECT_EQ(Checkpointed(plan), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(Evaluated(plan), (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(SpecConversions, ScheduleRoundTripsAndDefaultsToGPipe) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB}) {
    EXPECT_EQ(ScheduleFromSpec(ScheduleToSpec(kind)), kind);
  }
  EXPECT_EQ(ScheduleFromSpec(gpipe::v1::SCHEDULE_UNSPECIFIED),
            ScheduleKind::kGPipe);
  EXPECT_EQ(ScheduleToSpec(ScheduleKind::kOneFOneB), gpipe::v1::ONE_F_ONE_B);
}

TEST(SpecConversions, RematRoundTripsAndDefaultsToExceptLast) {
  for (RematMode mode :
       {RematMode::kAlways, RematMode::kExceptLast, RematMode::kNever}) {
    EXPECT_EQ(RematFromSpec(RematToSpec(mode)), mode);
  }
  EXPECT_EQ(RematFromSpec(gpipe::v1::REMAT_UNSPECIFIED),
            RematMode::kExceptLast);
}

}  // namespace
}  // namespace gpipe
