// Names of neighbouring stages, resolved the way the rest of the system
// resolves them: getaddrinfo (/etc/hosts, the resolv.conf search list,
// DNS), asking for IPv4 and IPv6 addresses apart and at once, so that a
// lookup that hangs for one family (a container DNS server that forwards
// AAAA questions for names it only has A records of, and the forward times
// out) does not hold up the other. gRPC's own resolver waits for both
// answers before it dials; behind such a server a named neighbour took
// 25 s to connect where its IP took 60 ms.
#ifndef GPIPE_SERVICES_TRANSPORT_RESOLVE_H_
#define GPIPE_SERVICES_TRANSPORT_RESOLVE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gpipe {

struct ResolvedTarget {
  // What gRPC dials without resolving again: "ipv4:10.0.0.5:7071" or
  // "ipv6:[fd00::5]:7071".
  std::string target;
  std::string host;  // the name asked for ("" when it was an IP already)
  std::string ip;
};

// Resolves the host of `address` (host:port). An IPv4 answer wins when it
// arrives no later than kIpv6Grace after an IPv6 one. Unavailable naming
// the host when neither family answers within `timeout` or both say there
// is no such name (its DNS record may not exist yet: callers retry);
// InvalidArgument for an address that is not host:port.
absl::StatusOr<ResolvedTarget> ResolveForDial(absl::string_view address,
                                              absl::Duration timeout);

inline constexpr absl::Duration kIpv6Grace = absl::Milliseconds(50);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_RESOLVE_H_
