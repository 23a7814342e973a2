// gpipectl: the command-line client. `train` and `plan` run here; `submit`,
// `status`, `list`, `watch`, `cancel` and `workers` talk to a controller;
// `local` starts a controller and workers on this machine for one job.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cli/commands.h"
#include "cli/security_flags.h"
#include "services/core/flags_help.h"
#include "services/core/memory.h"

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
  gpipe::KeepFreedMemory();
  AcceptDashedFlags(argc, argv);
  gpipe::ListProjectFlagsInHelp();
  absl::SetProgramUsageMessage(
      "gpipectl COMMAND [ARGS] [--flags]\n\n"
      "commands:\n"
      "  train JOB.json   train: the in-process pipeline, or the reference\n"
      "                   trainer with --stages 1\n"
      "                   [--stages K] [--micro-batches M] [--schedule "
      "gpipe|1f1b]\n"
      "                   [--remat always|except_last|never] [--steps N]\n"
      "                   [--out DIR] [--threads T] [--trace DIR]\n"
      "  plan JOB.json    predict throughput, bubble and memory for each K, "
      "M,\n"
      "                   schedule and remat mode [--stages-range 1..8]\n"
      "                   [--measure] [--memory-budget 2GiB]\n"
      "  local JOB.json   run the job on a controller and workers started on\n"
      "                   this machine [--workers K] [--keep DIR], with the\n"
      "                   flags of train (--trace DIR too)\n"
      "\n"
      "talking to a controller (--controller ADDR, default $GPIPE_CONTROLLER\n"
      "or 127.0.0.1:7070; --json prints protobuf JSON for scripts):\n"
      "  submit JOB.json  submit a job and print its id [--watch]\n"
      "  status [JOB]     one job in detail; without JOB, the list\n"
      "  list             all jobs: id, name, state, step, loss, age\n"
      "  watch JOB        follow a job to its end with a progress bar;\n"
      "                   exits 0 if it succeeded\n"
      "  cancel JOB       cancel a job\n"
      "  resume JOB       continue a cancelled or failed job from its newest\n"
      "                   checkpoint [--steps N] [--watch]\n"
      "  delete JOB       remove an ended job, its checkpoints and model\n"
      "  workers          the attached workers\n"
      "  fetch JOB        download the job's model.safetensors [-o DIR], or\n"
      "                   a committed checkpoint's files [--step N]\n"
      "  trace JOB        the stage timelines of the job's last steps: a\n"
      "                   summary, or -o trace.json (Chrome trace, for\n"
      "                   Perfetto) and/or -o timeline.svg; [--steps A..B]\n"
      "\n"
      "a secured controller (docs/security.md): --tls_ca CA.pem [--tls_cert\n"
      "CRT --tls_key KEY] [--tls_server_name NAME]; the token from\n"
      "--token_file FILE or $GPIPE_TOKEN (which does not show in ps)\n");
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
  }
  if (command == "train") return gpipe::cli::RunTrain(args);
  if (command == "plan") return gpipe::cli::RunPlan(args);
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
