// What a client (gpipectl, a worker's Attach and Exchange streams) needs to
// talk to a secured server: channel credentials (TLS or plaintext), the
// certificate name to expect, and a bearer token for each call.
#ifndef GPIPE_SERVICES_SECURITY_CLIENT_SECURITY_H_
#define GPIPE_SERVICES_SECURITY_CLIENT_SECURITY_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "services/security/tls.h"

namespace gpipe::security {

struct ClientSecurity {
  std::optional<TlsMaterial> tls;  // nullopt: plaintext
  // The name checked in the server's certificate instead of the host in the
  // address (workers reach each other by pod IP, which no certificate can
  // list). Empty: the address's host.
  std::string tls_server_name;
  std::string token;  // empty: none sent

  bool secure() const { return tls.has_value(); }
  std::shared_ptr<grpc::ChannelCredentials> Credentials() const {
    return MakeChannelCredentials(tls);
  }
  // Adds what the channel needs (the certificate name) to `args`.
  void ApplyTo(grpc::ChannelArguments& args) const;
  // Adds the bearer token to one call.
  void ApplyTo(grpc::ClientContext* context) const;
};

// The client's token: the first token of the file `--<flag>` names when
// given, else the environment variable `env` (trimmed; so the token does
// not show in `ps`), else empty. Errors name the flag or the variable.
absl::StatusOr<std::string> LoadClientToken(const std::string& flag,
                                            const std::string& path,
                                            const char* env);

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_CLIENT_SECURITY_H_
