#include "services/security/tls.h"

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/security/pem.h"
#include "services/security/secret_file.h"

namespace gpipe::security {
namespace {

std::string What(const char* flag, const std::string& path) {
  return absl::StrCat("--", flag, "=", path);
}

// Reads and checks --tls_cert and --tls_key into `tls`.
absl::Status LoadKeyPair(const TlsFlags& flags, TlsMaterial& tls) {
  if (flags.cert.empty() != flags.key.empty()) {
    return absl::InvalidArgumentError(
        flags.cert.empty()
            ? "--tls_key is given without --tls_cert: give both, the "
              "certificate and its private key"
            : "--tls_cert is given without --tls_key: give both, the "
              "certificate and its private key");
  }
  if (flags.cert.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(tls.cert_pem, ReadSecretFile("tls_cert", flags.cert));
  RETURN_IF_ERROR(
      CheckCertificatesPem(tls.cert_pem, What("tls_cert", flags.cert)));
  ASSIGN_OR_RETURN(tls.key_pem, ReadSecretFile("tls_key", flags.key));
  RETURN_IF_ERROR(CheckPrivateKeyPem(tls.key_pem, What("tls_key", flags.key)));
  return CheckKeyMatchesCertificate(tls.cert_pem, tls.key_pem,
                                    What("tls_cert", flags.cert),
                                    What("tls_key", flags.key));
}

absl::Status LoadCa(const TlsFlags& flags, TlsMaterial& tls) {
  if (flags.ca.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(tls.ca_pem, ReadSecretFile("tls_ca", flags.ca));
  return CheckCertificatesPem(tls.ca_pem, What("tls_ca", flags.ca));
}

}  // namespace

absl::StatusOr<std::optional<TlsMaterial>> LoadServerTls(
    const TlsFlags& flags) {
  if (flags.cert.empty() && flags.key.empty() && flags.ca.empty()) {
    return std::optional<TlsMaterial>();
  }
  if (flags.cert.empty() && flags.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca is given without --tls_cert and --tls_key: a TLS server "
        "needs its own certificate and key");
  }
  TlsMaterial tls;
  RETURN_IF_ERROR(LoadKeyPair(flags, tls));
  RETURN_IF_ERROR(LoadCa(flags, tls));
  return std::optional<TlsMaterial>(std::move(tls));
}

absl::StatusOr<std::optional<TlsMaterial>> LoadClientTls(
    const TlsFlags& flags) {
  if (flags.cert.empty() && flags.key.empty() && flags.ca.empty()) {
    return std::optional<TlsMaterial>();
  }
  if (flags.ca.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs --tls_ca: the CA certificate that the server's certificate "
        "is verified against");
  }
  TlsMaterial tls;
  RETURN_IF_ERROR(LoadKeyPair(flags, tls));
  RETURN_IF_ERROR(LoadCa(flags, tls));
  return std::optional<TlsMaterial>(std::move(tls));
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const std::optional<TlsMaterial>& tls) {
  if (!tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      tls->ca_pem.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls->ca_pem;
  options.pem_key_cert_pairs.push_back({tls->key_pem, tls->cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const std::optional<TlsMaterial>& tls) {
  if (!tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls->ca_pem;
  options.pem_private_key = tls->key_pem;
  options.pem_cert_chain = tls->cert_pem;
  return grpc::SslCredentials(options);
}

}  // namespace gpipe::security
