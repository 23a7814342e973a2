#include "cli/security_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "services/core/status.h"

ABSL_FLAG(std::string, tls_ca, "",
          "talking to a controller: PEM CA certificate that its certificate "
          "is verified against (TLS on)");
ABSL_FLAG(std::string, tls_cert, "",
          "talking to a controller: PEM client certificate, for mutual TLS "
          "(with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "the name expected in the controller's certificate (default: the "
          "host of --controller)");
ABSL_FLAG(std::string, token_file, "",
          "talking to a controller: file whose first line is the job API "
          "token (default: $GPIPE_TOKEN)");

namespace gpipe::cli {

absl::StatusOr<security::ClientSecurity> ClientSecurityFromFlags() {
  security::ClientSecurity s;
  ASSIGN_OR_RETURN(s.tls,
                   security::LoadClientTls({absl::GetFlag(FLAGS_tls_cert),
                                            absl::GetFlag(FLAGS_tls_key),
                                            absl::GetFlag(FLAGS_tls_ca)}));
  s.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  ASSIGN_OR_RETURN(
      s.token, security::LoadClientToken(
                   "token_file", absl::GetFlag(FLAGS_token_file), kTokenEnv));
  return s;
}

}  // namespace gpipe::cli
