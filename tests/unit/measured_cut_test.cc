// The cut's bubble from the stages' own times: a stage's costs per
// micro-batch from the steps its timeline kept, and the schedule simulated
// on them.
#include "services/pipeline/measured_cut.h"

#include <vector>

#include "gtest/gtest.h"

namespace gpipe {
namespace {

// A step of M micro-batches whose forward takes `f` ms, backward `b`
// (its weight half `w` of it, split when w > 0), recompute `r`, and the
// update `u`, back to back.
StepTimeline Step(int64_t m, double f, double b, double w, double r, double u) {
  StepTimeline s;
  int64_t t = 0;
  const auto op = [&](Phase phase, int64_t mb, double ms) {
    const int64_t ns = static_cast<int64_t>(ms * 1e6);
    s.ops.push_back({phase, mb, t, t + ns});
    t += ns;
  };
  for (int64_t i = 0; i < m; ++i) op(Phase::kForward, i, f);
  for (int64_t i = 0; i < m; ++i) {
    if (r > 0) op(Phase::kRecompute, i, r);
    if (w > 0) {
      op(Phase::kBackwardInput, i, b - w);
      op(Phase::kBackwardWeight, i, w);
    } else {
      op(Phase::kBackward, i, b);
    }
  }
  op(Phase::kOptimizer, -1, u);
  s.end_ns = t;
  return s;
}

TEST(MeasuredStageCost, EachPhasesMedianStepPerMicroBatch) {
  // The first step is slow (its allocations), one later step disturbed:
  // the medians read neither.
  const std::vector<StepTimeline> steps = {
      Step(4, 9, 20, 6, 3, 30), Step(4, 1, 2, 0.5, 0.8, 3),
      Step(4, 1, 2, 0.5, 0.8, 3), Step(4, 1.2, 2.5, 0.5, 0.8, 5)};
  const std::optional<StageCost> c = MeasuredStageCost(steps, 4);
  ASSERT_TRUE(c.has_value());
  EXPECT_NEAR(c->forward_seconds, 1e-3, 1e-9);
  // The recompute counts with the backward.
  EXPECT_NEAR(c->backward_seconds, 2.8e-3, 1e-9);
  EXPECT_NEAR(c->weight_seconds, 0.5e-3, 1e-9);
  EXPECT_NEAR(c->update_seconds, 3e-3, 1e-9);
}

TEST(MeasuredStageCost, NothingWithoutAStepOfForwardAndBackward) {
  EXPECT_FALSE(MeasuredStageCost({}, 4).has_value());
  StepTimeline forward_only;
  forward_only.ops.push_back({Phase::kForward, 0, 0, 1000});
  EXPECT_FALSE(MeasuredStageCost({forward_only}, 1).has_value());
  EXPECT_FALSE(MeasuredStageCost({Step(2, 1, 2, 0, 0, 1)}, 0).has_value());
}

TEST(SimulatedBubbles, AHeavierStageIdlesTheLighterOne) {
  StageCost light, heavy;
  light.forward_seconds = 1e-3;
  light.backward_seconds = 2e-3;
  heavy.forward_seconds = 4e-3;
  heavy.backward_seconds = 8e-3;
  // GPipe, K = 2, M = 4: equal stages idle (K-1)/(M+K-1) = 20% each.
  const std::vector<double> equal =
      SimulatedBubbles({light, light}, ScheduleKind::kGPipe, 4, 1, {});
  ASSERT_EQ(equal.size(), 2u);
  EXPECT_NEAR(equal[0], 0.2, 1e-9);
  EXPECT_NEAR(equal[1], 0.2, 1e-9);
  // The heavy stage sets the step: 12 ms x 4 plus the light one's first
  // forward and last backward (3 ms), 51 ms; the light one is busy 12.
  const std::vector<double> cut =
      SimulatedBubbles({light, heavy}, ScheduleKind::kGPipe, 4, 1, {});
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_NEAR(cut[0], 1 - 12.0 / 51, 1e-9);
  EXPECT_NEAR(cut[1], 1 - 48.0 / 51, 1e-9);
  // Interleaved: one bubble per worker, its two chunks together.
  EXPECT_EQ(SimulatedBubbles({light, heavy, light, heavy},
                             ScheduleKind::kInterleaved1F1B, 4, 2, {})
                .size(),
            2u);
}

TEST(SimulatedBubbles, NoneForAShapeTheScheduleRefuses) {
  StageCost c;
  c.forward_seconds = c.backward_seconds = 1e-3;
  EXPECT_TRUE(SimulatedBubbles({}, ScheduleKind::kGPipe, 4, 1, {}).empty());
  EXPECT_TRUE(SimulatedBubbles({c, c}, ScheduleKind::kGPipe, 0, 1, {}).empty());
  // Three stages are no whole number of 2-chunk workers.
  EXPECT_TRUE(
      SimulatedBubbles({c, c, c}, ScheduleKind::kInterleaved1F1B, 4, 2, {})
          .empty());
}

}  // namespace
}  // namespace gpipe
