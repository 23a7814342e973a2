// absl spells flags with underscores (--micro_batches); people type
// --micro-batches, and a Kubernetes manifest written from the README's
// prose would say --checkpoint-dir. Every binary takes both spellings.
#ifndef GPIPE_SERVICES_CORE_FLAG_SPELLING_H_
#define GPIPE_SERVICES_CORE_FLAG_SPELLING_H_

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

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_FLAG_SPELLING_H_
