// host:port addresses as workers advertise them and gRPC reports peers:
// IPv6 hosts in brackets ("[fd00::5]:7071"), wildcard hosts a server may
// listen on but nobody can dial.
#ifndef GPIPE_SERVICES_CORE_HOST_PORT_H_
#define GPIPE_SERVICES_CORE_HOST_PORT_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpipe {

struct HostPort {
  std::string host;  // without brackets; may be empty (":7071")
  int port = 0;
};

// "host:port", "[v6]:port" or ":port"; InvalidArgument naming `address`
// for anything else (no port, a port outside 1..65535, stray brackets).
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// An address flag's port in range: where the text after the last ':' of
// `address` is a number, it is 0..65535, else InvalidArgument naming
// `flag` ("--listen: port 99999 of '127.0.0.1:99999' is not in
// 0..65535"). gRPC took a larger one modulo 65536 and listened on or
// dialled another port. Other forms of a gRPC target are left alone.
absl::Status CheckPortInRange(absl::string_view flag,
                              absl::string_view address);

// "host:port", with brackets around an IPv6 host.
std::string JoinHostPort(absl::string_view host, int port);

// Hosts that mean "every interface": "", "0.0.0.0", "::", "*".
bool IsWildcardHost(absl::string_view host);

// The IP of a gRPC peer ("ipv4:10.0.0.5:43122", "ipv6:[fd00::5]:43122");
// nullopt for other transports (unix sockets, in-process).
std::optional<std::string> PeerIp(absl::string_view peer);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_HOST_PORT_H_
