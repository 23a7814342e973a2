#include "services/security/stream_key.h"

#include <openssl/rand.h>

#include "absl/strings/escaping.h"
#include "services/security/constant_time.h"

namespace gpipe::security {

absl::StatusOr<std::string> NewStreamKey() {
  unsigned char bytes[kStreamKeyBytes];
  if (RAND_bytes(bytes, kStreamKeyBytes) != 1) {
    return absl::InternalError(
        "OpenSSL RAND_bytes failed to make a stream key");
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), kStreamKeyBytes));
}

absl::Status CheckStreamKey(const std::string& expected,
                            const std::string& presented) {
  if (expected.empty()) return absl::OkStatus();
  if (presented.empty()) {
    return absl::PermissionDeniedError(
        "the stream carries no stream key: only the stage the controller "
        "assigned as upstream may open it");
  }
  if (!ConstantTimeEquals(expected, presented)) {
    return absl::PermissionDeniedError(
        "wrong stream key: the stream does not come from the stage the "
        "controller assigned as upstream");
  }
  return absl::OkStatus();
}

}  // namespace gpipe::security
