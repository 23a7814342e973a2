#include <cstdio>
#include <regex>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/progress.h"
#include "gtest/gtest.h"

namespace gpipe {
namespace {

// The samples/s of the last line `progress` wrote to `out`.
double LastRate(FILE* out) {
  std::fflush(out);
  std::rewind(out);
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, out) != nullptr) text += buf;
  std::smatch m;
  double rate = -1;
  const std::regex samples(R"(([0-9]+) samples/s)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), samples);
       it != std::sregex_iterator(); ++it) {
    rate = std::stod((*it)[1]);
  }
  return rate;
}

// A watch that was away (its controller restarted) counts its rate from
// its return: the time away read as the job's, 148 samples/s against a
// true 600.
TEST(ProgressTest, RestartRateLeavesTheTimeAwayOut) {
  for (const bool restart : {true, false}) {
    FILE* out = std::tmpfile();
    ASSERT_NE(out, nullptr);
    {
      Progress progress(100, out);
      progress.Update(10, 1.0, 10 * 32);
      absl::SleepFor(absl::Seconds(1.5));  // away
      if (restart) progress.RestartRate();
      progress.Update(11, 1.0, 11 * 32);
      absl::SleepFor(absl::Milliseconds(300));
      progress.Update(20, 1.0, 20 * 32);
    }
    // 9 steps of 32 in 0.3 s is 960 samples/s (a rate needs 0.25 s); with
    // the time away, 20 in 1.8 s is 356. Either is a ceiling: a loaded machine only sleeps
    // longer.
    const double rate = LastRate(out);
    std::fclose(out);
    if (restart) {
      EXPECT_GT(rate, 600) << "restarted";
    } else {
      EXPECT_GT(rate, 0);
      EXPECT_LT(rate, 500);
    }
  }
}

}  // namespace
}  // namespace gpipe
