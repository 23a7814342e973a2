// A job's state, step and loss as gpipectl prints them (cli/job_text.h).
#include "cli/job_text.h"
#include "gtest/gtest.h"

namespace gpipe::cli {
namespace {

TEST(JobTextTest, StateAndStep) {
  EXPECT_EQ(StateName(gpipe::v1::RUNNING), "RUNNING");
  EXPECT_EQ(StateName(gpipe::v1::JOB_STATE_UNSPECIFIED), "UNKNOWN");
  gpipe::v1::JobStatus s;
  s.set_step(120);
  s.set_total_steps(1000);
  EXPECT_EQ(StepText(s), "120/1000");
}

// A job failed for a loss that was not finite keeps its last finite loss
// in its status: list and status showed it (2196676983448418681505534489657344
// for an lr of 1e8) while /metrics said NaN.
TEST(JobTextTest, ALossThatWasNotFiniteIsSaid) {
  gpipe::v1::JobStatus s;
  EXPECT_EQ(LossText(s), "-");
  s.set_step(3);
  s.set_loss(0.1969);
  EXPECT_EQ(LossText(s), "0.1969");
  gpipe::v1::Condition& failed = *s.add_conditions();
  failed.set_type("Failed");
  failed.set_status(true);
  failed.set_reason("LossNotFinite");
  EXPECT_EQ(LossText(s), "not finite");
  failed.set_reason("InvalidData");
  EXPECT_EQ(LossText(s), "0.1969");
}

}  // namespace
}  // namespace gpipe::cli
