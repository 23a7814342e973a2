// What a client of the controller (a worker attaching, gpipectl) carries,
// from the TLS flags (tls_flags.h) and --token_file, which is defined here
// once for both. A binary has --token_file when it calls
// ClientSecurityFromFlags (the controller, which only checks tokens, does
// not).
#ifndef GPIPE_SERVICES_SECURITY_CLIENT_FLAGS_H_
#define GPIPE_SERVICES_SECURITY_CLIENT_FLAGS_H_

#include "absl/status/statusor.h"
#include "services/security/client_security.h"

namespace gpipe::security {

// The client TLS material (ClientTlsFromFlags), then the token: the file
// --token_file names, else the environment variable `token_env` (null:
// none). No tls_server_name: that flag is the caller's. Errors name the
// flag and the file, or the variable.
absl::StatusOr<ClientSecurity> ClientSecurityFromFlags(const char* token_env);

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_CLIENT_FLAGS_H_
