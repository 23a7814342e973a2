#include "services/security/pem.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gpipe::security {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Certificate = std::unique_ptr<X509, X509Free>;
using PrivateKey = std::unique_ptr<EVP_PKEY, KeyFree>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The reason of OpenSSL's last error, and the error queue emptied (it is
// per thread; a stale entry would be blamed on the next caller).
std::string TakeOpenSslError() {
  const unsigned long code = ERR_peek_last_error();
  std::string reason =
      code == 0 ? std::string("not parseable")
                : std::string(ERR_reason_error_string(code) != nullptr
                                  ? ERR_reason_error_string(code)
                                  : "not parseable");
  ERR_clear_error();
  return reason;
}

absl::Status NotPem(const std::string& what, const char* expected) {
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": not a PEM ", expected,
                   " (expected a block starting \"-----BEGIN", "\")"));
}

}  // namespace

absl::Status CheckCertificatesPem(const std::string& pem,
                                  const std::string& what) {
  if (!absl::StrContains(pem, "-----BEGIN CERTIFICATE-----")) {
    if (absl::StrContains(pem, "PRIVATE KEY-----")) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          ": holds a private key, not a certificate (swapped with the "
          "key flag?)"));
    }
    return NotPem(what, "certificate");
  }
  Bio bio = MemoryBio(pem);
  int count = 0;
  for (;;) {
    Certificate cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
    if (cert == nullptr) break;
    ++count;
  }
  // The loop ends at the end of the text (PEM_R_NO_START_LINE) or at a
  // block that does not parse.
  const unsigned long last = ERR_peek_last_error();
  const bool clean_end =
      last == 0 || (ERR_GET_LIB(last) == ERR_LIB_PEM &&
                    ERR_GET_REASON(last) == PEM_R_NO_START_LINE);
  if (count == 0 || !clean_end) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a certificate block does not parse (",
                     TakeOpenSslError(), ")"));
  }
  ERR_clear_error();
  return absl::OkStatus();
}

absl::Status CheckPrivateKeyPem(const std::string& pem,
                                const std::string& what) {
  if (!absl::StrContains(pem, "PRIVATE KEY-----")) {
    if (absl::StrContains(pem, "-----BEGIN CERTIFICATE-----")) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          ": holds a certificate, not a private key (swapped with the "
          "certificate flag?)"));
    }
    return NotPem(what, "private key");
  }
  if (absl::StrContains(pem, "ENCRYPTED")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": the private key is encrypted; give an unencrypted key "
                     "(openssl pkey -in KEY -out KEY.plain)"));
  }
  Bio bio = MemoryBio(pem);
  PrivateKey key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the private key does not parse (", TakeOpenSslError(), ")"));
  }
  ERR_clear_error();
  return absl::OkStatus();
}

absl::Status CheckKeyMatchesCertificate(const std::string& cert_pem,
                                        const std::string& key_pem,
                                        const std::string& cert_what,
                                        const std::string& key_what) {
  Bio cert_bio = MemoryBio(cert_pem);
  Certificate cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  Bio key_bio = MemoryBio(key_pem);
  PrivateKey key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr || key == nullptr) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat(cert_what, " or ", key_what, " does not parse"));
  }
  const bool match = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!match) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_what, " is not the private key of the certificate ", cert_what));
  }
  return absl::OkStatus();
}

}  // namespace gpipe::security
