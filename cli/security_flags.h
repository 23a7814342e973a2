// gpipectl's security flags: the TLS flags and --token_file shared with the
// workers (services/security/tls_flags.h, client_flags.h), the token also
// from $GPIPE_TOKEN, which unlike a flag value does not show in `ps`, and
// gpipectl's own --tls_server_name.
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
