// Whether a server could listen on an address, asked before gRPC is: its
// server builder only reports failure, after logging its own chain of
// errors ("No address added out of total 1 resolved ... errno:98") ahead of
// the line a user should read first.
#ifndef GPIPE_SERVICES_CORE_LISTEN_PROBE_H_
#define GPIPE_SERVICES_CORE_LISTEN_PROBE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gpipe {

// Binds a socket of our own to `address` (HOST:PORT, [V6]:PORT or :PORT) as
// gRPC's server does (SO_REUSEADDR, no SO_REUSEPORT) and closes it.
// Unavailable naming `what`, the address and the system's reason ("in use by
// another process", "not an address of this host") when it cannot; OK for
// port 0 and for targets that are not a host and port (gRPC decides those).
// A port taken between this probe and the server's own bind still fails
// there.
absl::Status ProbeListen(absl::string_view what, absl::string_view address);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_LISTEN_PROBE_H_
