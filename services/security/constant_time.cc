#include "services/security/constant_time.h"

#include <openssl/crypto.h>

namespace gpipe::security {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  if (a.empty()) return true;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace gpipe::security
