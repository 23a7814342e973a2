#include "services/core/flags_help.h"

#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace gpipe {

void ListProjectFlagsInHelp() {
  absl::FlagsUsageConfig config;
  // Flag files are recorded as the compiler saw them (e.g.
  // "../../worker/main.cc"); absl's own flags come from its headers' paths.
  auto ours = [](absl::string_view file) {
    return !absl::StrContains(file, "absl/");
  };
  config.contains_helpshort_flags = ours;
  config.contains_help_flags = ours;
  absl::SetFlagsUsageConfig(config);
}

}  // namespace gpipe
