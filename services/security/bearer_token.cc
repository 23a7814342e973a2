#include "services/security/bearer_token.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/credentials.h"
#include "services/core/strings.h"
#include "services/security/constant_time.h"

namespace gpipe::security {
namespace {

constexpr std::string_view kBearerPrefix = "Bearer ";

}  // namespace

grpc::Status TokenVerifier::Check(const grpc::ServerContext& context,
                                  std::string_view what) const {
  if (!enabled()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorizationHeader);
  if (it == metadata.end()) return CheckHeader(nullptr, what);
  const std::string_view header(it->second.data(), it->second.size());
  return CheckHeader(&header, what);
}

grpc::Status TokenVerifier::CheckHeader(const std::string_view* header,
                                        std::string_view what) const {
  if (!enabled()) return grpc::Status::OK;
  if (header == nullptr ||
      !absl::StartsWithIgnoreCase(
          absl::string_view(header->data(), header->size()),
          absl::string_view(kBearerPrefix.data(), kBearerPrefix.size()))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        absl::StrCat("missing bearer token (", AsAbsl(what),
                                     " needs `authorization: Bearer TOKEN`)"));
  }
  const std::string_view presented = header->substr(kBearerPrefix.size());
  // Every token is compared, so the time does not say which one matched.
  bool match = false;
  for (const std::string& token : tokens_) {
    match |= ConstantTimeEquals(presented, token);
  }
  if (!match) {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        absl::StrCat("invalid bearer token for ", AsAbsl(what)));
  }
  return grpc::Status::OK;
}

void AttachBearerToken(grpc::ClientContext* context, const std::string& token,
                       bool secure_channel) {
  if (token.empty()) return;
  if (secure_channel) {
    context->set_credentials(grpc::AccessTokenCredentials(token));
  } else {
    context->AddMetadata(kAuthorizationHeader,
                         absl::StrCat(AsAbsl(kBearerPrefix), token));
  }
}

}  // namespace gpipe::security
