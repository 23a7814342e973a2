// host:port parsing as workers advertise addresses and gRPC names peers.
#include "services/core/host_port.h"

#include "gtest/gtest.h"

namespace gpipe {
namespace {

TEST(HostPortTest, ParsesHostsIpv6AndWildcards) {
  absl::StatusOr<HostPort> p = ParseHostPort("worker-1.gpipe:7071");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->host, "worker-1.gpipe");
  EXPECT_EQ(p->port, 7071);
  p = ParseHostPort("[fd00::5]:80");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->host, "fd00::5");
  p = ParseHostPort(":7071");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(IsWildcardHost(p->host));
  EXPECT_TRUE(IsWildcardHost(ParseHostPort("0.0.0.0:1")->host));
  EXPECT_TRUE(IsWildcardHost(ParseHostPort("[::]:1")->host));
  EXPECT_FALSE(IsWildcardHost(ParseHostPort("127.0.0.1:1")->host));
  for (const char* bad : {"host", "host:", "host:0", "host:65536", "::1:80",
                          "[::1:80", "fd00::5]:80", "[]:80", "h:x"}) {
    EXPECT_FALSE(ParseHostPort(bad).ok()) << bad;
  }
}

TEST(HostPortTest, JoinsAndReadsPeers) {
  EXPECT_EQ(JoinHostPort("10.0.0.5", 7071), "10.0.0.5:7071");
  EXPECT_EQ(JoinHostPort("fd00::5", 7071), "[fd00::5]:7071");
  EXPECT_EQ(PeerIp("ipv4:10.88.0.5:43122"), "10.88.0.5");
  EXPECT_EQ(PeerIp("ipv6:[fd00::5]:43122"), "fd00::5");
  EXPECT_EQ(PeerIp("unix:/tmp/s"), std::nullopt);
  EXPECT_EQ(PeerIp("ipv4:garbage"), std::nullopt);
}

TEST(HostPortTest, APortPastTheRangeIsRefusedNamingTheFlag) {
  for (const char* fine :
       {"127.0.0.1:0", "127.0.0.1:65535", "[::1]:7070",
        "dns:///controller:7070", "unix:/tmp/s", "", "controller",
        "127.0.0.1:065535", "h:0000000000080", "h:00000"}) {
    EXPECT_TRUE(CheckPortInRange("--listen", fine).ok()) << fine;
  }
  const absl::Status s = CheckPortInRange("--listen", "127.0.0.1:99999");
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_EQ(s.message(),
            "--listen: port 99999 of '127.0.0.1:99999' is not in 0..65535");
  EXPECT_FALSE(CheckPortInRange("--controller", "[::1]:65536").ok());
  EXPECT_FALSE(CheckPortInRange("--controller", "h:99999999999999999999").ok());
}

}  // namespace
}  // namespace gpipe
