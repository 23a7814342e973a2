#include "services/core/flags_help.h"

#include <string>

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace gpipe {

void ListProjectFlagsInHelp(const char* argv0) {
  absl::FlagsUsageConfig config;
  // absl's own --version said "Debug build (NDEBUG not #defined)" of a
  // release build: it reads NDEBUG where absl itself was compiled.
  const std::string program(
      absl::string_view(argv0).substr(absl::string_view(argv0).rfind('/') + 1));
  config.version_string = [program] {
    return absl::StrCat(program, " (gpipe, ",
#ifdef NDEBUG
                        "release build",
#else
                        "debug build",
#endif
                        ")\n");
  };
  // Flag files are recorded as the compiler saw them (e.g.
  // "../../worker/main.cc"); absl's own flags come from its headers' paths.
  auto ours = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.contains_helpshort_flags = ours;
  config.contains_help_flags = ours;
  // --help grouped the flags under the build machine's source paths ("Flags
  // from work/main/worker/main.cc"): ours go under the binary's name.
  config.normalize_filename = [program, ours](absl::string_view file) {
    return ours(file) ? program : std::string(file);
  };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace gpipe
