// absl's --help lists only the flags defined in a file named after the
// binary (gpipe-worker.cc, gpipectl_main.cc); ours live in main.cc and in
// cli/*.cc, so a plain --help said "No flags matched". Called before
// ParseCommandLine, this makes --help and --helpshort list every flag the
// project defines, and not absl's own (those stay under --helpfull).
#ifndef GPIPE_SERVICES_CORE_FLAGS_HELP_H_
#define GPIPE_SERVICES_CORE_FLAGS_HELP_H_

namespace gpipe {

// Also --version: the binary's name (from argv[0]) and its build type.
void ListProjectFlagsInHelp(const char* argv0);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_FLAGS_HELP_H_
