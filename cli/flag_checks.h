// gpipectl's flags checked before a command runs. A negative count was
// read as "the default", a thread count no machine has crashed libgomp, a
// non-finite cost gave a plan of zeros, and a --out that cannot be a
// directory was found only after the training it was meant to keep: each
// is now refused at once, naming the flag and the value.
#ifndef GPIPE_CLI_FLAG_CHECKS_H_
#define GPIPE_CLI_FLAG_CHECKS_H_

#include <string>

#include "absl/status/status.h"

namespace gpipe::cli {

// Worker processes `local` may start on this machine (the compute threads
// a command may ask for are services/core/cores.h's kMaxThreads).
inline constexpr int64_t kMaxLocalWorkers = 256;

// The numeric flags `command` reads, each within its range; errors name
// the flag, e.g. "--threads: must be between 0 (the usable cores) and
// 1024, got 100000".
absl::Status CheckNumericFlags(const std::string& command);

// Every "--name[=value]" or "-name[=value]" of the command line
// (underscored, as absl spells flags) names a flag and gives it a value it
// takes, checked before absl's parser sees them: that parser ends the
// process with status 1 and "ERROR: Illegal value ...", where a usage
// error is status 2 here. Errors name the flag as typed: "--seed: '-1' is
// not a whole number >= 0", "--bogus: no such flag (gpipectl COMMAND --help
// lists a command's flags)". A command line with --flagfile, --fromenv,
// --tryfromenv or --undefok is left to absl's parser whole.
absl::Status CheckFlagSyntax(int argc, char** argv);

// Every flag of the command line that some gpipectl command takes is one
// `command` takes (cli/help.cc lists them): plan took --balance, --out,
// --keep, --threads and --device without a word and printed its plan as if
// they had never been given. Errors name the flag as typed: "--balance:
// plan does not take this flag (gpipectl plan --help lists its flags)".
// Flags no command lists, and a command line with --flagfile, --fromenv,
// --tryfromenv or --undefok, are left as they were.
absl::Status CheckCommandTakesFlags(const std::string& command, int argc,
                                    char** argv);

// A warning on stderr when --threads asks for more than the cores this
// process may use: allowed (a container's quota can read lower than what
// it gets), but threads past the cores share them and run slower, not
// faster (a typo of 1000 trained at a fiftieth of the speed).
void WarnAboutThreads(const std::string& command);

// A command's exit status for `status`: 2 (usage) for a flag's value the
// flag does not take (InvalidArgument, its message starting with the flag:
// "--steps: ..."), as CheckNumericFlags' refusals are, else 1 (failure).
int ExitCodeFor(const absl::Status& status);

// Prints "gpipectl COMMAND: message" on stderr and returns ExitCodeFor.
int FailCommand(const char* command, const absl::Status& status);

// `dir` (the value of `flag`, e.g. "--out") made a directory now, before
// any work whose result goes there; an error says why it cannot be.
absl::Status MakeOutputDir(const std::string& flag, const std::string& dir);

}  // namespace gpipe::cli

#endif  // GPIPE_CLI_FLAG_CHECKS_H_
