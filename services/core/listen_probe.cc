#include "services/core/listen_probe.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "services/core/host_port.h"

namespace gpipe {
namespace {

std::string Reason(int error) {
  switch (error) {
    case EADDRINUSE:
      return "in use by another process";
    case EADDRNOTAVAIL:
      return "not an address of this host";
    case EACCES:
      return "a port below 1024 needs privileges";
    default:
      return std::strerror(error);
  }
}

}  // namespace

absl::Status ProbeListen(absl::string_view what, absl::string_view address) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok() || parsed->port == 0) return absl::OkStatus();
  const std::string port = absl::StrCat(parsed->port);
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  // ":PORT" and "*:PORT": every interface, as gRPC takes them.
  const bool any = parsed->host.empty() || parsed->host == "*";
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(any ? nullptr : parsed->host.c_str(), port.c_str(),
                          &hints, &found);
      e != 0) {
    return absl::UnavailableError(
        absl::StrCat(what, "cannot listen on ", address, ": cannot resolve '",
                     parsed->host, "': ", gai_strerror(e)));
  }
  // One address that binds is enough: gRPC listens wherever it can.
  int error = 0;
  bool bound = false;
  for (addrinfo* a = found; a != nullptr && !bound; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0) {
      bound = true;
    } else {
      error = errno;
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (bound || error == 0) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(what, "cannot listen on ", address, ": ", Reason(error)));
}

}  // namespace gpipe
