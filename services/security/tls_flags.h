// The --tls_cert, --tls_key and --tls_ca flags, defined here once for
// gpipe-controller, gpipe-worker and gpipectl, and read into TLS material
// (tls.h says what each side does with them). A binary has these flags
// when it calls something declared here: the static library's object file
// is then linked in, and with it the flag definitions.
#ifndef GPIPE_SERVICES_SECURITY_TLS_FLAGS_H_
#define GPIPE_SERVICES_SECURITY_TLS_FLAGS_H_

#include <optional>

#include "absl/status/statusor.h"
#include "services/security/tls.h"

namespace gpipe::security {

// The three paths as given on the command line.
TlsFlags TlsFlagsFromCommandLine();

// LoadServerTls and LoadClientTls of the flags; errors name the flag and
// the file.
absl::StatusOr<std::optional<TlsMaterial>> ServerTlsFromFlags();
absl::StatusOr<std::optional<TlsMaterial>> ClientTlsFromFlags();

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_TLS_FLAGS_H_
