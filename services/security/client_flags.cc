#include "services/security/client_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "services/core/status.h"
#include "services/security/tls_flags.h"

ABSL_FLAG(std::string, token_file, "",
          "file whose first token (one per line, # comments) is presented to "
          "the controller: a worker's to attach (the controller's "
          "--worker_token_file), gpipectl's for the job API (default: "
          "$GPIPE_TOKEN)");

namespace gpipe::security {

absl::StatusOr<ClientSecurity> ClientSecurityFromFlags(const char* token_env) {
  ClientSecurity s;
  ASSIGN_OR_RETURN(s.tls, ClientTlsFromFlags());
  ASSIGN_OR_RETURN(
      s.token, LoadClientToken("token_file", absl::GetFlag(FLAGS_token_file),
                               token_env));
  return s;
}

}  // namespace gpipe::security
