#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"
#include "services/core/flag_spelling.h"

ABSL_FLAG(int64_t, spelling_steps, 0, "a value flag of this test");
ABSL_FLAG(std::string, spelling_prompt, "", "a text flag of this test");
ABSL_FLAG(bool, spelling_watch, false, "a switch of this test");

namespace gpipe {
namespace {

// The command line after SpellFlagsForAbsl, as absl's parser sees it.
std::vector<std::string> Spelt(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  SpellFlagsForAbsl(static_cast<int>(argv.size()), argv.data());
  std::vector<std::string> out;
  for (size_t i = 1; i < argv.size(); ++i) out.emplace_back(argv[i]);
  return out;
}

using Args = std::vector<std::string>;

TEST(FlagSpelling, DashedNamesTakeAbslsUnderscores) {
  EXPECT_EQ(Spelt({"--spelling-steps", "3", "-spelling-watch", "--no-such-x"}),
            (Args{"--spelling_steps", "3", "-spelling_watch", "--no_such_x"}));
  EXPECT_EQ(Spelt({"--spelling-steps=-3-4"}), (Args{"--spelling_steps=-3-4"}));
}

TEST(FlagSpelling, AValueGivenApartKeepsItsDashes) {
  EXPECT_EQ(Spelt({"--spelling-prompt", "--a-b", "--spelling-watch"}),
            (Args{"--spelling_prompt", "--a-b", "--spelling_watch"}));
  EXPECT_EQ(Spelt({"-spelling-prompt", "-a-b"}),
            (Args{"-spelling_prompt", "-a-b"}));
  // A switch takes no value: what follows it is read on its own.
  EXPECT_EQ(Spelt({"--spelling-watch", "--spelling-steps", "2"}),
            (Args{"--spelling_watch", "--spelling_steps", "2"}));
  EXPECT_EQ(Spelt({"--nospelling-watch", "--spelling-steps", "2"}),
            (Args{"--nospelling_watch", "--spelling_steps", "2"}));
  // A switch's "no" with a dash, as absl spells it; not for a value flag.
  EXPECT_EQ(Spelt({"--no-spelling-watch", "--no-spelling-steps=3"}),
            (Args{"--nospelling_watch", "--no_spelling_steps=3"}));
  EXPECT_EQ(Spelt({"--no-spelling-watch=false"}),
            (Args{"--nospelling_watch=false"}));
}

TEST(FlagSpelling, ArgumentsAndEverythingAfterTheEndStayAsTyped) {
  EXPECT_EQ(Spelt({"my-job.json", "-1", "-", "--", "--spelling-steps"}),
            (Args{"my-job.json", "-1", "-", "--", "--spelling-steps"}));
  EXPECT_TRUE(IsFlagArgument("-o"));
  EXPECT_FALSE(IsFlagArgument("-1"));
  EXPECT_FALSE(IsFlagArgument("--"));
  EXPECT_FALSE(IsFlagArgument("-"));
}

}  // namespace
}  // namespace gpipe
