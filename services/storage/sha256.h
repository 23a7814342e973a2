// SHA-256 digests (OpenSSL's libcrypto EVP), as lowercase hex: what
// checkpoint manifests record to detect a corrupt or truncated file.
#ifndef GPIPE_SERVICES_STORAGE_SHA256_H_
#define GPIPE_SERVICES_STORAGE_SHA256_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace gpipe::storage {

std::string Sha256Hex(std::string_view bytes);

// A digest computed as the bytes arrive (a file streamed over the network,
// which is never whole in memory).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void Update(std::string_view bytes);
  // The digest of everything so far, as lowercase hex; ends the digest.
  std::string Finish();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// The digest of a whole file, read in chunks; errors name `path`.
absl::StatusOr<std::string> Sha256File(const std::string& path);

}  // namespace gpipe::storage

#endif  // GPIPE_SERVICES_STORAGE_SHA256_H_
