// gpipectl: the command-line client. `train` and `plan` run here; `submit`,
// `status`, `list`, `watch`, `cancel` and `workers` talk to a controller;
// `local` starts a controller and workers on this machine for one job.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cli/commands.h"
#include "cli/flag_checks.h"
#include "cli/help.h"
#include "cli/security_flags.h"
#include "services/core/flag_spelling.h"
#include "services/core/flags_help.h"
#include "services/core/memory.h"

int main(int argc, char** argv) {
  gpipe::KeepFreedMemory();
  gpipe::ExplainOutOfMemory();
  gpipe::SpellFlagsForAbsl(argc, argv);
  gpipe::ListProjectFlagsInHelp(argv[0]);
  absl::SetProgramUsageMessage(gpipe::cli::OverviewHelp());
  // Our own help: a command's flags, not absl's list by source file.
  if (const std::optional<int> helped =
          gpipe::cli::PrintHelpIfAsked(argc, argv))
    return *helped;
  if (absl::Status s = gpipe::cli::CheckFlagSyntax(argc, argv); !s.ok()) {
    std::fprintf(stderr, "gpipectl: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(rest.begin() + 1, rest.end());
  if (args.empty()) {
    std::fprintf(stderr, "%s\n", absl::ProgramUsageMessage().data());
    return 2;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  // Bad security flags are refused before anything is sent.
  if (command == "submit" || command == "status" || command == "list" ||
      command == "watch" || command == "cancel" || command == "delete" ||
      command == "workers" || command == "trace" || command == "fetch" ||
      command == "resume") {
    if (auto security = gpipe::cli::ClientSecurityFromFlags(); !security.ok()) {
      std::fprintf(stderr, "gpipectl %s: %s\n", command.c_str(),
                   std::string(security.status().message()).c_str());
      return 2;
    }
    if (absl::Status s = gpipe::cli::CheckControllerAddress(); !s.ok()) {
      std::fprintf(stderr, "gpipectl %s: %s\n", command.c_str(),
                   std::string(s.message()).c_str());
      return 2;
    }
  }
  if (absl::Status s = gpipe::cli::CheckCommandTakesFlags(command, argc, argv);
      !s.ok()) {
    std::fprintf(stderr, "gpipectl %s: %s\n", command.c_str(),
                 std::string(s.message()).c_str());
    return 2;
  }
  if (absl::Status s = gpipe::cli::CheckNumericFlags(command); !s.ok()) {
    std::fprintf(stderr, "gpipectl %s: %s\n", command.c_str(),
                 std::string(s.message()).c_str());
    return 2;
  }
  if (absl::Status s = gpipe::cli::CheckArgumentCount(command, args); !s.ok()) {
    std::fprintf(stderr, "gpipectl %s: %s\n", command.c_str(),
                 std::string(s.message()).c_str());
    return 2;
  }
  gpipe::cli::WarnAboutThreads(command);
  if (command == "train") return gpipe::cli::RunTrain(args);
  if (command == "plan") return gpipe::cli::RunPlan(args);
  if (command == "eval") return gpipe::cli::RunEval(args);
  if (command == "predict") return gpipe::cli::RunPredict(args);
  if (command == "generate") return gpipe::cli::RunGenerate(args);
  if (command == "submit") return gpipe::cli::RunSubmit(args);
  if (command == "status") return gpipe::cli::RunStatus(args);
  if (command == "list") return gpipe::cli::RunList(args);
  if (command == "watch") return gpipe::cli::RunWatch(args);
  if (command == "cancel") return gpipe::cli::RunCancel(args);
  if (command == "delete") return gpipe::cli::RunDelete(args);
  if (command == "workers") return gpipe::cli::RunWorkers(args);
  if (command == "local") return gpipe::cli::RunLocal(args);
  if (command == "trace") return gpipe::cli::RunTrace(args);
  if (command == "fetch") return gpipe::cli::RunFetch(args);
  if (command == "resume") return gpipe::cli::RunResume(args);
  std::fprintf(stderr, "gpipectl: unknown command '%s'\n\n%s\n",
               command.c_str(), absl::ProgramUsageMessage().data());
  return 2;
}
