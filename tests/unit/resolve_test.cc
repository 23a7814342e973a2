// Neighbour names resolved for dialling: IP literals pass through, names
// come back as a target gRPC dials without resolving again, and a name
// that does not resolve is Unavailable (callers retry) within the timeout.
// tests/scripts/named_neighbour_test.sh covers a DNS server that never
// answers AAAA, with real processes.
#include "services/transport/resolve.h"

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace gpipe {
namespace {

TEST(ResolveTest, IpLiteralsPassThrough) {
  absl::StatusOr<ResolvedTarget> r =
      ResolveForDial("10.1.2.3:7071", absl::Seconds(1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->target, "ipv4:10.1.2.3:7071");
  EXPECT_EQ(r->host, "");
  r = ResolveForDial("[fd00::5]:7071", absl::Seconds(1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->target, "ipv6:[fd00::5]:7071");
}

TEST(ResolveTest, NamesFromHostsResolve) {
  absl::StatusOr<ResolvedTarget> r =
      ResolveForDial("localhost:7071", absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->host, "localhost");
  EXPECT_TRUE(r->target == "ipv4:127.0.0.1:7071" ||
              r->target == "ipv6:[::1]:7071")
      << r->target;
}

TEST(ResolveTest, BadAddressesAndUnknownNames) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      ResolveForDial("no-port", absl::Seconds(1)).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ResolveForDial(":7071", absl::Seconds(1)).status()));
  // RFC 6761: .invalid never resolves. Whatever the resolver does, the
  // answer comes within the timeout.
  const absl::Time start = absl::Now();
  absl::Status s =
      ResolveForDial("no-such-stage.invalid:7071", absl::Seconds(2)).status();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

}  // namespace
}  // namespace gpipe
