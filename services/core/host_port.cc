#include "services/core/host_port.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gpipe {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" ", why,
                     " (want host:port, or [IPv6]:port)"));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("has no port");
  absl::string_view host = address.substr(0, colon);
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return bad("has no port in 1..65535");
  }
  if (absl::ConsumePrefix(&host, "[")) {
    if (!absl::ConsumeSuffix(&host, "]") || host.empty()) {
      return bad("has unbalanced brackets");
    }
  } else if (absl::StrContains(host, '[') || absl::StrContains(host, ']')) {
    return bad("has unbalanced brackets");
  } else if (absl::StrContains(host, ':')) {
    return bad("has an IPv6 host without brackets");
  }
  return HostPort{std::string(host), port};
}

absl::Status CheckPortInRange(absl::string_view flag,
                              absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return absl::OkStatus();
  const absl::string_view digits = address.substr(colon + 1);
  if (digits.empty() ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return absl::OkStatus();
  }
  // Leading zeros are the same port to the resolver ("065535").
  const size_t first = std::min(digits.find_first_not_of('0'), digits.size());
  const absl::string_view value = digits.substr(first);
  if (value.size() <= 5) {
    int port = 0;
    if (value.empty() || (absl::SimpleAtoi(value, &port) && port <= 65535))
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      flag, ": port ", digits, " of '", address, "' is not in 0..65535"));
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

std::optional<std::string> PeerIp(absl::string_view peer) {
  if (!absl::ConsumePrefix(&peer, "ipv4:") &&
      !absl::ConsumePrefix(&peer, "ipv6:")) {
    return std::nullopt;
  }
  absl::StatusOr<HostPort> parsed = ParseHostPort(peer);
  // gRPC writes IPv6 peers percent-encoded at times ("[fe80::1%25eth0]").
  if (!parsed.ok() || parsed->host.empty()) return std::nullopt;
  return parsed->host;
}

}  // namespace gpipe
