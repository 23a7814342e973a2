// gpipectl --help and gpipectl COMMAND --help: each command's own usage and
// flags (with their defaults), instead of absl's list of every flag grouped
// by the source file that defines it.
#ifndef GPIPE_CLI_HELP_H_
#define GPIPE_CLI_HELP_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gpipe::cli {

// The overview: every command with one line each.
std::string OverviewHelp();

// COMMAND's usage, summary and flags; empty for an unknown command.
std::string CommandHelp(const std::string& command);

// The flags `command` takes (as absl spells them, underscored), or null
// for a command gpipectl does not have.
const std::vector<const char*>* CommandFlags(const std::string& command);

// InvalidArgument naming the first argument past those `command`'s usage
// takes ("unexpected argument 'extra' (usage: gpipectl train JOB.json)"):
// the command printed its usage line alone. OK for an unknown command.
absl::Status CheckArgumentCount(const std::string& command,
                                const std::vector<std::string>& args);

// Whether any command takes the flag `name`.
bool SomeCommandTakes(absl::string_view name);

// Prints the help argv asks for (--help, -h or --helpshort anywhere; the
// first argument that is neither a flag nor a flag's value names the
// command) and returns the exit status (0; 2 for a command there is none
// of), or nullopt when it asks for none.
std::optional<int> PrintHelpIfAsked(int argc, char** argv);

}  // namespace gpipe::cli

#endif  // GPIPE_CLI_HELP_H_
