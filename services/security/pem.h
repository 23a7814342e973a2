// Checks that PEM text holds what a flag promises (certificates, a private
// key, a key that belongs to a certificate) with OpenSSL, before gRPC gets
// it: gRPC would only fail later, at the first handshake, with a message
// that names neither the flag nor the file.
#ifndef GPIPE_SERVICES_SECURITY_PEM_H_
#define GPIPE_SERVICES_SECURITY_PEM_H_

#include <string>

#include "absl/status/status.h"

namespace gpipe::security {

// OK when `pem` holds at least one X.509 certificate and nothing that fails
// to parse. `what` names the source in errors ("--tls_cert=/x/tls.crt").
absl::Status CheckCertificatesPem(const std::string& pem,
                                  const std::string& what);

// OK when `pem` holds a private key.
absl::Status CheckPrivateKeyPem(const std::string& pem,
                                const std::string& what);

// OK when the private key in `key_pem` belongs to the first certificate in
// `cert_pem` (both already checked).
absl::Status CheckKeyMatchesCertificate(const std::string& cert_pem,
                                        const std::string& key_pem,
                                        const std::string& cert_what,
                                        const std::string& key_what);

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_PEM_H_
