#include "services/core/flag_spelling.h"

#include <cstring>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gpipe {
namespace {

// The flag `name` names, or for "nofoo" the boolean flag foo; null for
// none.
const absl::CommandLineFlag* FindFlag(absl::string_view name) {
  if (const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name))
    return flag;
  if (!absl::StartsWith(name, "no")) return nullptr;
  const absl::CommandLineFlag* positive =
      absl::FindCommandLineFlag(name.substr(2));
  return positive != nullptr && positive->IsOfType<bool>() ? positive : nullptr;
}

}  // namespace

bool IsFlagArgument(absl::string_view arg) {
  if (absl::StartsWith(arg, "--")) return arg.size() > 2;
  return arg.size() > 1 && arg[0] == '-' && absl::ascii_isalpha(arg[1]);
}

void SpellFlagsForAbsl(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* arg = argv[i];
    if (absl::string_view(arg) == "--") break;
    if (!IsFlagArgument(arg)) continue;
    char* name = arg + (arg[1] == '-' ? 2 : 1);
    char* p = name;
    for (; *p != '\0' && *p != '='; ++p)
      if (*p == '-') *p = '_';
    // --no-replace-workers: absl says a boolean flag's "no" without a
    // separator (--noreplace_workers).
    if (absl::StartsWith(name, "no_") &&
        absl::FindCommandLineFlag(absl::string_view(name, p - name)) ==
            nullptr) {
      const absl::CommandLineFlag* positive =
          absl::FindCommandLineFlag(absl::string_view(name + 3, p - name - 3));
      if (positive != nullptr && positive->IsOfType<bool>()) {
        std::memmove(name + 2, name + 3, std::strlen(name + 3) + 1);
        --p;
      }
    }
    if (*p == '=') continue;
    const absl::CommandLineFlag* flag = FindFlag(name);
    if (flag != nullptr && !flag->IsOfType<bool>()) ++i;  // its value
  }
}

absl::Status CheckNoArguments(absl::string_view program,
                              const std::vector<char*>& rest) {
  if (rest.size() <= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unexpected argument '", rest[1],
                   "' (every setting is a flag: ", program, " --help)"));
}

}  // namespace gpipe
