#include "services/transport/resolve.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/core/host_port.h"

namespace gpipe {
namespace {

// One family's answer: the first address, or why there is none.
struct Answer {
  std::optional<std::string> ip;
  std::string error;
};

// What the two lookups share with the caller, who may stop waiting before
// they end: a lookup that hangs finishes on its own thread and is dropped.
struct Lookups {
  absl::Mutex mu;
  std::optional<Answer> v4 ABSL_GUARDED_BY(mu);
  std::optional<Answer> v6 ABSL_GUARDED_BY(mu);
  absl::Time v6_at ABSL_GUARDED_BY(mu);
  int answers ABSL_GUARDED_BY(mu) = 0;
};

Answer Lookup(const std::string& host, int family) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  Answer answer;
  if (rc != 0) {
    answer.error = gai_strerror(rc);
    return answer;
  }
  char text[INET6_ADDRSTRLEN] = {0};
  for (addrinfo* a = found; a != nullptr && !answer.ip; a = a->ai_next) {
    const void* raw =
        a->ai_family == AF_INET
            ? static_cast<const void*>(
                  &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
            : static_cast<const void*>(
                  &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    if (inet_ntop(a->ai_family, raw, text, sizeof(text)) != nullptr) {
      answer.ip = text;
    }
  }
  freeaddrinfo(found);
  if (!answer.ip) answer.error = "no address";
  return answer;
}

std::string Target(const std::string& ip, int port) {
  return ip.find(':') == std::string::npos
             ? absl::StrCat("ipv4:", ip, ":", port)
             : absl::StrCat("ipv6:[", ip, "]:", port);
}

bool IsIpLiteral(const std::string& host) {
  unsigned char buffer[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buffer) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

}  // namespace

absl::StatusOr<ResolvedTarget> ResolveForDial(absl::string_view address,
                                              absl::Duration timeout) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok()) return parsed.status();
  ResolvedTarget resolved;
  if (IsIpLiteral(parsed->host)) {
    resolved.ip = parsed->host;
    resolved.target = Target(parsed->host, parsed->port);
    return resolved;
  }
  if (parsed->host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\" has no host to dial"));
  }
  resolved.host = parsed->host;
  auto lookups = std::make_shared<Lookups>();
  std::thread([lookups, host = parsed->host] {
    Answer a = Lookup(host, AF_INET);
    absl::MutexLock lock(&lookups->mu);
    lookups->v4 = std::move(a);
    ++lookups->answers;
  }).detach();
  std::thread([lookups, host = parsed->host] {
    Answer a = Lookup(host, AF_INET6);
    absl::MutexLock lock(&lookups->mu);
    lookups->v6 = std::move(a);
    lookups->v6_at = absl::Now();
    ++lookups->answers;
  }).detach();

  const absl::Time deadline = absl::Now() + timeout;
  Lookups& l = *lookups;
  absl::MutexLock lock(&l.mu);
  int seen = 0;
  while (true) {
    const bool v4_ok = l.v4 && l.v4->ip;
    const bool v6_ok = l.v6 && l.v6->ip;
    if (v4_ok) {
      resolved.ip = *l.v4->ip;
      break;
    }
    const bool v4_done = l.v4.has_value();
    // IPv6 answered: use it once IPv4 has failed or had its grace.
    if (v6_ok && (v4_done || absl::Now() >= l.v6_at + kIpv6Grace)) {
      resolved.ip = *l.v6->ip;
      break;
    }
    if (v4_done && l.v6.has_value()) {
      return absl::UnavailableError(
          absl::StrCat("cannot resolve ", parsed->host, ": ", l.v4->error,
                       " (IPv4), ", l.v6->error, " (IPv6)"));
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("cannot resolve ", parsed->host, " within ",
                       absl::FormatDuration(timeout)));
    }
    seen = l.answers;
    const absl::Time wake =
        v6_ok ? std::min(deadline, l.v6_at + kIpv6Grace) : deadline;
    auto answered = [&l, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(l.mu) {
      return l.answers != seen;
    };
    l.mu.AwaitWithDeadline(absl::Condition(&answered), wake);
  }
  resolved.target = Target(resolved.ip, parsed->port);
  return resolved;
}

}  // namespace gpipe
