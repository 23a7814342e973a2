#include "services/security/token_file.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/core/status.h"
#include "services/security/secret_file.h"

namespace gpipe::security {

absl::StatusOr<std::vector<std::string>> ParseTokens(const std::string& text,
                                                     const std::string& what) {
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    for (const char c : line) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (u <= 0x20 || u >= 0x7f) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " line ", line_number,
            ": a token may hold only printable ASCII without spaces"));
      }
    }
    if (line.size() < kMinTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " line ", line_number, ": the token is shorter than ",
          kMinTokenBytes, " characters (make one with: openssl rand -hex 32)"));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": holds no token (only blank or # lines)"));
  }
  return tokens;
}

absl::StatusOr<std::vector<std::string>> ReadTokenFile(
    const std::string& flag, const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadSecretFile(flag, path));
  return ParseTokens(text, absl::StrCat("--", flag, "=", path));
}

}  // namespace gpipe::security
