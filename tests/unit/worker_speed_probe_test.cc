// The start-up speed probe: a positive figure, and a worker standing for a
// 4x slower machine (--compute_slowdown 4) probes far slower.
#include "worker/speed_probe.h"

#include "gtest/gtest.h"

namespace gpipe {
namespace {

TEST(SpeedProbeTest, ASlowdownShowsInTheProbe) {
  absl::StatusOr<double> fast = ProbeComputeSpeed(1.0, 0.06);
  absl::StatusOr<double> slow = ProbeComputeSpeed(4.0, 0.06);
  ASSERT_TRUE(fast.ok()) << fast.status();
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_GT(*fast, 0);
  // 1/4 of the speed, give or take a noisy machine.
  EXPECT_LT(*slow, 0.6 * *fast) << *slow << " vs " << *fast;
}

}  // namespace
}  // namespace gpipe
