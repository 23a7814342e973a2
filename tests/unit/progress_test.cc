// The progress bar's figures: a job that goes back to an earlier step (a
// restart replays from a checkpoint, as `gpipectl watch` sees after a
// controller restart) never shows a negative rate, and the rate counts
// from the replay on.
#include "cli/progress.h"

#include <cstdio>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// What the bar printed (plain lines: the file is not a terminal).
std::string Printed(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  return out;
}

TEST(ProgressTest, AReplayAfterARestartNeverShowsANegativeRate) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    // Watched from step 300 of 400; the job goes back to 200 and replays.
    Progress progress(400, f, /*start_step=*/300);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    progress.Update(200, 0.5, 200 * 32);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    progress.Update(220, 0.4, 220 * 32);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    progress.Update(400, 0.3, 400 * 32);
  }
  const std::string out = Printed(f);
  std::fclose(f);
  EXPECT_THAT(out, HasSubstr("step 400/400"));
  EXPECT_THAT(out, Not(HasSubstr("  -")));  // "-982 samples/s" before
  EXPECT_THAT(out, HasSubstr("samples/s"));
}

// A watch that joins a running job: the status it starts from may be
// older than the first report, and a few milliseconds between reports are
// no rate. It starts counting at the first report and says it is measuring
// until a quarter second has passed.
TEST(ProgressTest, AWatchMidRunShowsNoRateBeforeItCanMeasureOne) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress progress(1000, f, /*start_step=*/300);
    progress.Update(389, 0.5, 389 * 128);  // made before the watch began
    progress.Update(400, 0.5, 400 * 128);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    progress.Update(1000, 0.4, 1000 * 128);
  }
  const std::string out = Printed(f);
  std::fclose(f);
  EXPECT_THAT(out,
              HasSubstr("step 389/1000  loss 0.5000  (measuring the rate)"));
  EXPECT_THAT(out, HasSubstr("step 1000/1000"));
  // 611 steps of 128 in about 0.3 s: far below the 389 steps' burst.
  EXPECT_THAT(out, HasSubstr("samples/s"));
}

}  // namespace
}  // namespace gpipe
