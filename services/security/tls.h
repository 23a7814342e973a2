// TLS from the --tls_cert, --tls_key and --tls_ca flags that the controller,
// the workers and gpipectl share, turned into gRPC credentials. With none of
// the flags everything stays plaintext (local runs, CI).
//
// A server given --tls_ca requires every client to present a certificate
// signed by that CA (mutual TLS): the controller and the workers' Stage
// ports then accept only peers holding the cluster's certificates.
#ifndef GPIPE_SERVICES_SECURITY_TLS_H_
#define GPIPE_SERVICES_SECURITY_TLS_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace gpipe::security {

// Paths as the flags give them; empty: not given.
struct TlsFlags {
  std::string cert;  // --tls_cert: PEM certificate chain, leaf first
  std::string key;   // --tls_key: its PEM private key (unencrypted)
  std::string ca;    // --tls_ca: PEM CA certificate(s) that sign the peers
};

// The checked PEM texts.
struct TlsMaterial {
  std::string cert_pem;  // empty for a client without a certificate
  std::string key_pem;
  std::string ca_pem;  // empty for a server that does not verify clients
};

// The server side: nullopt when no flag is given. --tls_cert and --tls_key
// go together; --tls_ca alone is an error (a server needs its own
// certificate). INVALID_ARGUMENT/NOT_FOUND/PERMISSION_DENIED naming the
// flag and file otherwise (see secret_file.h, pem.h).
absl::StatusOr<std::optional<TlsMaterial>> LoadServerTls(const TlsFlags& flags);

// The client side: nullopt when no flag is given. --tls_ca is required (it
// is what the server's certificate is verified against); --tls_cert and
// --tls_key, together, are the client's certificate for mutual TLS.
absl::StatusOr<std::optional<TlsMaterial>> LoadClientTls(const TlsFlags& flags);

// Insecure credentials for nullopt. A server with a CA requires and
// verifies client certificates.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(
    const std::optional<TlsMaterial>& tls);
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const std::optional<TlsMaterial>& tls);

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_TLS_H_
