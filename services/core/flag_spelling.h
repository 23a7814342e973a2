// absl spells flags with underscores (--micro_batches); people type
// --micro-batches, and a Kubernetes manifest written from the README's
// prose would say --checkpoint-dir. Every binary takes both spellings.
#ifndef GPIPE_SERVICES_CORE_FLAG_SPELLING_H_
#define GPIPE_SERVICES_CORE_FLAG_SPELLING_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gpipe {

// "--name..." or "-name..." (absl takes one dash too); not "-", "-1" or
// "--".
bool IsFlagArgument(absl::string_view arg);

// Rewrites the names of the command line's flags, "--micro-batches" and
// "-micro-batches", as absl spells them ("--micro_batches"), before anything
// else reads the command line. A value given apart from its flag ("--name
// my-job", "--prompt -a-b") is left as typed, and so is everything after
// "--".
void SpellFlagsForAbsl(int argc, char** argv);

// OK when absl's parser left no argument but the program's name (`rest`,
// ParseCommandLine's answer); a service takes every setting as a flag, and
// took a stray word silently. The error names the first: "unexpected
// argument 'extra' (every setting is a flag: gpipe-worker --help)".
absl::Status CheckNoArguments(absl::string_view program,
                              const std::vector<char*>& rest);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_FLAG_SPELLING_H_
