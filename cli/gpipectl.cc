// gpipectl: the command-line client. `gpipectl train JOB.json` runs the
// single-process reference trainer; later commands talk to a controller.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cli/commands.h"

namespace {

// absl flags are spelled with underscores; users type --micro-batches too.
void AcceptDashedFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    char* a = argv[i];
    if (a[0] != '-' || a[1] != '-') continue;
    if (a[2] == '\0') break;  // "--" ends the flags
    for (char* p = a + 2; *p != '\0' && *p != '='; ++p)
      if (*p == '-') *p = '_';
  }
}

}  // namespace

int main(int argc, char** argv) {
  AcceptDashedFlags(argc, argv);
  absl::SetProgramUsageMessage(
      "gpipectl COMMAND [ARGS] [--flags]\n\n"
      "commands:\n"
      "  train JOB.json   train: the in-process pipeline, or the reference\n"
      "                   trainer with --stages 1\n"
      "                   [--stages K] [--micro-batches M] [--schedule "
      "gpipe|1f1b]\n"
      "                   [--remat always|except_last|never] [--steps N]\n"
      "                   [--out DIR] [--threads T]\n"
      "  plan JOB.json    predict throughput, bubble and memory for each K, "
      "M,\n"
      "                   schedule and remat mode [--stages-range 1..8]\n"
      "                   [--measure] [--memory-budget 2GiB]\n");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(rest.begin() + 1, rest.end());
  if (args.empty()) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "train") return gpipe::cli::RunTrain(args);
  if (command == "plan") return gpipe::cli::RunPlan(args);
  std::fprintf(stderr, "gpipectl: unknown command '%s'\n\n%s\n",
               command.c_str(), absl::ProgramUsageMessage().data());
  return 2;
}
