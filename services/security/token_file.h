// Bearer token files: one token per line; blank lines and lines starting
// with '#' are ignored, surrounding whitespace is trimmed. Several tokens
// let an operator rotate one without a moment when the old one is refused.
#ifndef GPIPE_SERVICES_SECURITY_TOKEN_FILE_H_
#define GPIPE_SERVICES_SECURITY_TOKEN_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gpipe::security {

// Shorter tokens are refused: a guessable token is worse than none because
// it looks like protection.
inline constexpr size_t kMinTokenBytes = 16;

// The tokens in `text`; `what` names the source in errors. INVALID_ARGUMENT
// when there is none, or a token is shorter than kMinTokenBytes or holds
// characters that cannot travel in an HTTP/2 header (spaces inside,
// control bytes, non-ASCII); the error names the line, never the token.
absl::StatusOr<std::vector<std::string>> ParseTokens(const std::string& text,
                                                     const std::string& what);

// ParseTokens of the file that flag `--<flag>` names.
absl::StatusOr<std::vector<std::string>> ReadTokenFile(const std::string& flag,
                                                       const std::string& path);

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_TOKEN_FILE_H_
