// Status plumbing: of parts that failed together, FirstCause names the one
// that caused the others (not a part cancelled by it, nor one that says it
// ended because of another); a stored message cut short stays valid UTF-8.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "services/core/status.h"
#include "services/core/strings.h"

namespace gpipe {
namespace {

TEST(CoreStatusTest, FirstCauseSkipsCancelledPartsAndConsequences) {
  const absl::Status cancelled = absl::CancelledError("link closed");
  const absl::Status ended = MarkConsequence(
      absl::AbortedError("stage 0: the evaluation ended: failure of stage 2"));
  const absl::Status cause =
      absl::ResourceExhaustedError("out of memory: a tensor of 12.0 MiB");
  EXPECT_TRUE(FirstCause({}).ok());
  EXPECT_TRUE(FirstCause({absl::OkStatus(), absl::OkStatus()}).ok());
  // The cause, wherever it comes among its consequences.
  EXPECT_EQ(FirstCause({cancelled, ended, cause}), cause);
  EXPECT_EQ(FirstCause({ended, cause, cancelled}), cause);
  // Without one, a consequence says more than a cancel.
  EXPECT_EQ(FirstCause({cancelled, ended}), ended);
  EXPECT_EQ(FirstCause({cancelled}), cancelled);
  // Of two causes, the first.
  const absl::Status other = absl::InvalidArgumentError("bad batch");
  EXPECT_EQ(FirstCause({other, cause}), other);
  EXPECT_TRUE(IsConsequence(ended));
  EXPECT_FALSE(IsConsequence(cause));
}

TEST(CoreStatusTest, Utf8PrefixCutsAtACharacterBoundary) {
  const std::string text = "a\xc3\xa9\xe2\x82\xac";  // a, e-acute, euro
  EXPECT_EQ(Utf8Prefix(text, 100), text);
  EXPECT_EQ(Utf8Prefix(text, 6), text);
  EXPECT_EQ(Utf8Prefix(text, 5), "a\xc3\xa9");  // not half the euro
  EXPECT_EQ(Utf8Prefix(text, 4), "a\xc3\xa9");
  EXPECT_EQ(Utf8Prefix(text, 3), "a\xc3\xa9");
  EXPECT_EQ(Utf8Prefix(text, 2), "a");
  EXPECT_EQ(Utf8Prefix(text, 0), "");
}

}  // namespace
}  // namespace gpipe
