#include "cli/security_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "services/core/status.h"
#include "services/security/client_flags.h"

ABSL_FLAG(std::string, tls_server_name, "",
          "the name expected in the controller's certificate (default: the "
          "host of --controller)");

namespace gpipe::cli {

absl::StatusOr<security::ClientSecurity> ClientSecurityFromFlags() {
  ASSIGN_OR_RETURN(security::ClientSecurity s,
                   security::ClientSecurityFromFlags(kTokenEnv));
  s.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  return s;
}

}  // namespace gpipe::cli
