// gpipectl's TLS and token flags (--tls_ca, --tls_cert, --tls_key,
// --tls_server_name, --token_file; the token also from $GPIPE_TOKEN, which
// unlike a flag value does not show in `ps`).
#ifndef GPIPE_CLI_SECURITY_FLAGS_H_
#define GPIPE_CLI_SECURITY_FLAGS_H_

#include "absl/status/statusor.h"
#include "services/security/client_security.h"

namespace gpipe::cli {

inline constexpr char kTokenEnv[] = "GPIPE_TOKEN";

// The flags, read and checked; errors name the flag and the file.
absl::StatusOr<security::ClientSecurity> ClientSecurityFromFlags();

}  // namespace gpipe::cli

#endif  // GPIPE_CLI_SECURITY_FLAGS_H_
