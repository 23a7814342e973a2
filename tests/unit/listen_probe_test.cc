#include "services/core/listen_probe.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

// A socket listening on a loopback port the kernel chose.
class Listening {
 public:
  Listening() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~Listening() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(ListenProbeTest, ATakenPortIsNamedWithItsReason) {
  Listening taken;
  const std::string address = absl::StrCat("127.0.0.1:", taken.port());
  const absl::Status s = ProbeListen("--listen: ", address);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_EQ(s.message(), absl::StrCat("--listen: cannot listen on ", address,
                                      ": in use by another process"));
  // The wildcard host covers loopback's port too.
  EXPECT_FALSE(ProbeListen("", absl::StrCat(":", taken.port())).ok());
}

TEST(ListenProbeTest, AFreePortIsLeftFree) {
  int port = 0;
  {
    Listening was;
    port = was.port();
  }
  const std::string address = absl::StrCat("127.0.0.1:", port);
  EXPECT_TRUE(ProbeListen("", address).ok());
  // The probe closed its socket: the port can be taken again.
  EXPECT_TRUE(ProbeListen("", address).ok());
}

TEST(ListenProbeTest, AnAddressOfAnotherHostIsNamed) {
  // TEST-NET-1 (RFC 5737) is nobody's address.
  const absl::Status s = ProbeListen("", "192.0.2.1:7070");
  EXPECT_THAT(s.message(), HasSubstr("not an address of this host")) << s;
}

TEST(ListenProbeTest, PortZeroAndOtherTargetsAreLeftToGrpc) {
  EXPECT_TRUE(ProbeListen("", "127.0.0.1:0").ok());
  EXPECT_TRUE(ProbeListen("", "unix:/tmp/gpipe-probe.sock").ok());
}

}  // namespace
}  // namespace gpipe
