// The start-up speed probe: a positive figure, and a worker standing for a
// 4x slower machine (--compute_slowdown 4) probes far slower.
#include <algorithm>

#include "gtest/gtest.h"
#include "worker/speed_probe.h"

namespace gpipe {
namespace {

TEST(SpeedProbeTest, ASlowdownShowsInTheProbe) {
  // The best of three unslowed probes: one can be preempted on a loaded
  // machine (seen in CI: 24 GFLOP/s against a slowed probe's 27).
  double fast = 0;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<double> probe = ProbeComputeSpeed(1.0, 0.06);
    ASSERT_TRUE(probe.ok()) << probe.status();
    EXPECT_GT(*probe, 0);
    fast = std::max(fast, *probe);
  }
  absl::StatusOr<double> slow = ProbeComputeSpeed(4.0, 0.06);
  ASSERT_TRUE(slow.ok()) << slow.status();
  // 1/4 of the speed, give or take a noisy machine.
  EXPECT_LT(*slow, 0.6 * fast) << *slow << " vs " << fast;
}

}  // namespace
}  // namespace gpipe
