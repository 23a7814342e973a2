#include "services/security/client_security.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/security/bearer_token.h"
#include "services/security/token_file.h"

namespace gpipe::security {

void ClientSecurity::ApplyTo(grpc::ChannelArguments& args) const {
  if (secure() && !tls_server_name.empty()) {
    args.SetSslTargetNameOverride(tls_server_name);
  }
}

void ClientSecurity::ApplyTo(grpc::ClientContext* context) const {
  AttachBearerToken(context, token, secure());
}

absl::StatusOr<std::string> LoadClientToken(const std::string& flag,
                                            const std::string& path,
                                            const char* env) {
  if (!path.empty()) {
    ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                     ReadTokenFile(flag, path));
    return tokens.front();
  }
  const char* value = env != nullptr ? std::getenv(env) : nullptr;
  if (value == nullptr || *value == '\0') return std::string();
  ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                   ParseTokens(value, absl::StrCat("$", env)));
  return tokens.front();
}

}  // namespace gpipe::security
