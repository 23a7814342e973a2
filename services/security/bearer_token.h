// Bearer tokens on gRPC calls: the client sends
// `authorization: Bearer <token>`; the server accepts the call only when
// the token is one of its token file's (constant-time compare).
#ifndef GPIPE_SERVICES_SECURITY_BEARER_TOKEN_H_
#define GPIPE_SERVICES_SECURITY_BEARER_TOKEN_H_

#include <string>
#include <string_view>
#include <vector>

#include "grpcpp/client_context.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/status.h"

namespace gpipe::security {

inline constexpr char kAuthorizationHeader[] = "authorization";

// The server's check. A verifier without tokens (no token file given)
// accepts every call: that is the plaintext local setup.
class TokenVerifier {
 public:
  TokenVerifier() = default;
  explicit TokenVerifier(std::vector<std::string> tokens)
      : tokens_(std::move(tokens)) {}

  bool enabled() const { return !tokens_.empty(); }

  // UNAUTHENTICATED "missing bearer token" when the call carries no
  // `authorization: Bearer` header, "invalid bearer token" when it names
  // none of the tokens. `what` says what the token is for, e.g. "the job
  // API", and goes into the message.
  grpc::Status Check(const grpc::ServerContext& context,
                     std::string_view what) const;
  // The same on the header's value (tests, and servers without a context).
  grpc::Status CheckHeader(const std::string_view* header,
                           std::string_view what) const;

 private:
  std::vector<std::string> tokens_;
};

// Attaches `token` to a call (nothing when empty). On a TLS channel this is
// gRPC's call credentials, which gRPC sends only over a secure transport; on
// a plaintext channel (local runs) it is plain metadata, since gRPC refuses
// call credentials there.
void AttachBearerToken(grpc::ClientContext* context, const std::string& token,
                       bool secure_channel);

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_BEARER_TOKEN_H_
