// Reads the small files that hold credentials (certificates, keys, tokens),
// with errors that name the flag and the file, so a misconfigured pod says
// what to fix instead of failing a handshake later.
#ifndef GPIPE_SERVICES_SECURITY_SECRET_FILE_H_
#define GPIPE_SERVICES_SECURITY_SECRET_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace gpipe::security {

// Larger files are refused: a credential is a few kilobytes, and a path
// pointing at a disk image by mistake must not be read into memory.
inline constexpr size_t kMaxSecretFileBytes = 1 << 20;

// The contents of `path`, given by flag `--<flag>`. NOT_FOUND when it does
// not exist, PERMISSION_DENIED when it cannot be read, INVALID_ARGUMENT when
// it is a directory, empty or larger than kMaxSecretFileBytes.
absl::StatusOr<std::string> ReadSecretFile(const std::string& flag,
                                           const std::string& path);

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_SECRET_FILE_H_
