#include "services/security/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

// One text per flag for all three binaries, so each says what the flag
// does on the server side (the controller, a worker's Stage port) and on
// the client side (a worker, gpipectl). Without them everything is
// plaintext, as a local cluster wants it (docs/security.md).
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (with --tls_key): the controller and a worker's "
          "Stage port serve TLS with it; a worker and gpipectl present it to "
          "the controller (a worker also to its downstream stage) for mutual "
          "TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate: the controller and a worker's Stage port then "
          "require client certificates signed by it; a worker and gpipectl "
          "verify the controller's (and other workers') certificates against "
          "it (TLS on)");

namespace gpipe::security {

TlsFlags TlsFlagsFromCommandLine() {
  return {absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
          absl::GetFlag(FLAGS_tls_ca)};
}

absl::StatusOr<std::optional<TlsMaterial>> ServerTlsFromFlags() {
  return LoadServerTls(TlsFlagsFromCommandLine());
}

absl::StatusOr<std::optional<TlsMaterial>> ClientTlsFromFlags() {
  return LoadClientTls(TlsFlagsFromCommandLine());
}

}  // namespace gpipe::security
