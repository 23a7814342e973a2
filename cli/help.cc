#include "cli/help.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace gpipe::cli {
namespace {

struct Command {
  const char* name;
  const char* usage;    // arguments after the command's name
  const char* brief;    // one line, for the overview
  const char* summary;  // one or more lines
  std::vector<const char*> flags;
};

// What talking to a controller takes.
const std::vector<const char*> kClient = {
    "controller", "timeout",         "tls_ca",    "tls_cert",
    "tls_key",    "tls_server_name", "token_file"};

std::vector<const char*> With(std::vector<const char*> own,
                              const std::vector<const char*>& more) {
  own.insert(own.end(), more.begin(), more.end());
  return own;
}

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"train",
       "JOB.json",
       "train here: the in-process pipeline or the reference trainer",
       "Trains on this machine: the in-process pipeline of K stages on\n"
       "threads, or the single-process reference trainer with --stages 1;\n"
       "a progress bar, evaluations, and the model with --out.",
       {"stages", "replicas", "micro_batches", "schedule", "virtual_stages",
        "remat", "balance", "steps", "threads", "device", "out", "trace"}},
      {"plan",
       "JOB.json",
       "predict throughput, bubble and memory for each K and M",
       "Predicts throughput, bubble and memory for each K, M, schedule and\n"
       "remat mode, and marks the best that fits. Each stage (and replica)\n"
       "is assumed a core or machine of its own at this machine's\n"
       "one-thread speed: by the cost model (FLOPs at the measured sgemm\n"
       "rate, each product at least its weight's read at the measured\n"
       "triad rate), or with --measure by timing every layer here, which\n"
       "convolutions and small layers need (done without --measure where\n"
       "the cost model puts the timing under --measure-under seconds and\n"
       "no rate is given). Exits 3 when the spec's own\n"
       "configuration would be refused (the plan is printed all the same),\n"
       "1 when no configuration fits the memory budget or on an error.",
       {"stages_range", "stages", "workers", "replicas", "micro_batches",
        "schedule", "virtual_stages", "remat", "measure", "measure_under",
        "memory_budget", "flops", "memory_gbps", "layer_overhead_us",
        "link_gbps", "link_latency_us", "message_us", "blocking_sends"}},
      {"local",
       "JOB.json",
       "run the job on a controller and workers on this machine",
       "Runs the job on a controller and workers started on this machine,\n"
       "to its end, then stops them.",
       {"workers",  "stages",          "replicas", "micro_batches",
        "schedule", "virtual_stages",  "remat",    "balance",
        "steps",    "threads",         "device",   "data_plane",
        "out",      "trace",           "keep",     "metrics_targets",
        "ports",    "replace_workers", "json",     "timeout"}},
      {"eval",
       "MODEL.safetensors [JOB.json]",
       "loss and accuracy of a trained model",
       "Loss and accuracy of a trained model on its own data's test split\n"
       "(the job in the file), or on JOB.json's data; computed as training\n"
       "computed its evaluations, so the same flags give the same figures.\n"
       "MODEL.safetensors may be the folder --out or fetch wrote it into.",
       {"split", "max_samples", "stages", "micro_batches", "schedule", "remat",
        "threads", "device", "json"}},
      {"predict",
       "MODEL.safetensors INPUT.npy|INPUT.csv|INPUT.png|INPUT.jpg|INPUT.pgm",
       "a classifier's classes for your samples",
       "A classifier's most likely classes for each sample of INPUT, read\n"
       "and normalized as the model's training data was; --stages K runs\n"
       "it through K pipeline stages (each holding only its layers).\n"
       "MODEL.safetensors may be the folder --out or fetch wrote it into.",
       {"top", "stages", "json", "logits", "csv_header"}},
      {"generate",
       "MODEL.safetensors --prompt TEXT",
       "continue a text with a language model",
       "Samples a language model's continuation of the prompt token by\n"
       "token with a key/value cache, streaming it; text models read and\n"
       "write bytes through the vocabulary their file records, token-id\n"
       "models ids. The same seed gives the same text. --stages K splits\n"
       "the model into K stages (each its own layers and caches) that\n"
       "every token passes through; --device cuda runs them on the GPU.\n"
       "MODEL.safetensors may be the folder --out or fetch wrote it into.",
       {"prompt", "tokens", "temperature", "top_k", "seed", "stages", "threads",
        "device"}},
      {"submit", "JOB.json", "submit a job to a controller",
       "Submits a job to the controller and prints its id.",
       With({"watch", "json", "stages", "replicas", "micro_batches", "schedule",
             "virtual_stages", "remat", "balance", "steps"},
            kClient)},
      {"status", "[JOB]", "one job in detail; without JOB, the list",
       "One job in detail; without JOB, the list.", With({"json"}, kClient)},
      {"list", "", "all jobs: id, name, state, step, loss, age",
       "All jobs: id, name, state, step, loss, age.", With({"json"}, kClient)},
      {"watch", "JOB", "follow a job to its end",
       "Follows a job to its end with a progress bar; exits 0 if it "
       "succeeded.",
       With({"json"}, kClient)},
      {"cancel", "JOB", "cancel a job", "Cancels a job.",
       With({"json"}, kClient)},
      {"resume", "JOB", "continue a cancelled or failed job",
       "Continues a cancelled or failed job from its newest checkpoint.",
       With({"steps", "watch", "json"}, kClient)},
      {"delete", "JOB", "remove an ended job, its checkpoints and model",
       "Removes an ended job, its checkpoints and model.",
       With({"json"}, kClient)},
      {"workers", "", "the attached workers", "The attached workers.",
       With({"json"}, kClient)},
      {"fetch", "JOB", "download a job's model or a checkpoint",
       "Downloads the job's model.safetensors, or a kept checkpoint's files\n"
       "with --step, checked against their sha256.",
       With({"o", "step"}, kClient)},
      {"trace", "JOB", "the stage timelines of a job's last steps",
       "The stage timelines of the job's last steps: a summary, or files\n"
       "(-o trace.json for Perfetto, -o timeline.svg).",
       With({"o", "steps", "json"}, kClient)},
  };
  return *commands;
}

// The commands a part of a flag's help starts with ("train, submit: "), or
// none where it starts otherwise.
std::vector<absl::string_view> PartCommands(absl::string_view text) {
  const size_t colon = text.find(": ");
  if (colon == absl::string_view::npos) return {};
  std::vector<absl::string_view> names =
      absl::StrSplit(text.substr(0, colon), ", ");
  for (absl::string_view name : names)
    if (CommandFlags(std::string(name)) == nullptr) return {};
  return names;
}

// A flag that several commands read says what it does for each in parts,
// "train, local: ...; trace: ...". A command's help shows its own part,
// without the names; the whole text where no part names the command.
std::string HelpFor(absl::string_view command, absl::string_view help) {
  std::vector<size_t> starts = {0};
  for (size_t i = 1; i + 2 < help.size(); ++i) {
    if ((help[i - 1] == ';' || help[i - 1] == '.') && help[i] == ' ' &&
        !PartCommands(help.substr(i + 1)).empty()) {
      starts.push_back(i + 1);
    }
  }
  starts.push_back(help.size() + 1);
  for (size_t p = 0; p + 1 < starts.size(); ++p) {
    absl::string_view part =
        help.substr(starts[p], starts[p + 1] - 1 - starts[p]);
    const std::vector<absl::string_view> names = PartCommands(part);
    if (std::find(names.begin(), names.end(), command) == names.end()) continue;
    part.remove_prefix(part.find(": ") + 2);
    while (!part.empty() && (part.back() == ';' || part.back() == ' '))
      part.remove_suffix(1);
    return std::string(part);
  }
  return std::string(help);
}

std::string FlagLines(absl::string_view command,
                      const std::vector<const char*>& names) {
  std::string out;
  for (const char* name : names) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    std::string dashed = name;
    for (char& c : dashed) c = c == '_' ? '-' : c;
    // A one-letter flag is written as one: "-o DIR".
    absl::StrAppend(&out, dashed.size() == 1 ? "  -" : "  --", dashed);
    const std::string def = flag->DefaultValue();
    if (!def.empty() && def != "false" && def != "0" && def != "\"\"") {
      absl::StrAppend(&out, " (default ", def, ")");
    }
    absl::StrAppend(&out, "\n      ", HelpFor(command, flag->Help()), "\n");
  }
  return out;
}

}  // namespace

const std::vector<const char*>* CommandFlags(const std::string& command) {
  for (const Command& c : Commands())
    if (command == c.name) return &c.flags;
  return nullptr;
}

absl::Status CheckArgumentCount(const std::string& command,
                                const std::vector<std::string>& args) {
  for (const Command& c : Commands()) {
    if (command != c.name) continue;
    // The usage's words, less its flags and their values ("--prompt TEXT").
    size_t most = 0;
    bool value = false;
    for (absl::string_view word :
         absl::StrSplit(c.usage, ' ', absl::SkipEmpty())) {
      if (value) {
        value = false;
      } else if (absl::StartsWith(word, "--")) {
        value = true;
      } else {
        ++most;
      }
    }
    if (args.size() <= most) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", args[most], "' (usage: gpipectl ",
                     c.name, *c.usage == '\0' ? "" : " ", c.usage, ")"));
  }
  return absl::OkStatus();
}

bool SomeCommandTakes(absl::string_view name) {
  for (const Command& c : Commands())
    for (const char* flag : c.flags)
      if (name == flag) return true;
  return false;
}

std::string OverviewHelp() {
  std::string out =
      "gpipectl COMMAND [ARGS] [--flags]: pipeline-parallel training, here "
      "or on a cluster\n\ncommands:\n";
  for (const Command& c : Commands()) {
    absl::StrAppend(
        &out, "  ", c.name,
        std::string(std::max<int>(1, 10 - std::strlen(c.name)), ' '), c.brief,
        "\n");
  }
  absl::StrAppend(&out,
                  "\ngpipectl COMMAND --help shows a command's arguments and "
                  "flags. Flags may\nbe written --micro-batches or "
                  "--micro_batches. A controller is named by --controller\n"
                  "ADDR, else $GPIPE_CONTROLLER, else 127.0.0.1:7070; a "
                  "secured one takes --tls_ca,\n--tls_cert, --tls_key and "
                  "the token from --token_file or $GPIPE_TOKEN\n"
                  "(docs/security.md).\n");
  return out;
}

std::string CommandHelp(const std::string& command) {
  for (const Command& c : Commands()) {
    if (command != c.name) continue;
    return absl::StrCat("usage: gpipectl ", c.name, *c.usage ? " " : "",
                        c.usage, " [flags]\n\n", c.summary, "\n\nflags:\n",
                        FlagLines(c.name, c.flags));
  }
  return "";
}

std::optional<int> PrintHelpIfAsked(int argc, char** argv) {
  bool asked = false;
  std::string command;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-h" || a == "--helpshort" || a == "help") {
      asked = true;
    } else if (a.size() > 1 && a[0] == '-' &&
               a.find('=') == std::string::npos) {
      // "--controller HOST:PORT status --help": a flag that takes a value
      // takes the next argument, which is no command.
      const std::string name = a.substr(a[1] == '-' ? 2 : 1);
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag != nullptr && !flag->IsOfType<bool>()) ++i;
    } else if (command.empty() && !a.empty() && a[0] != '-') {
      command = a;
    }
  }
  if (!asked) return std::nullopt;
  if (command.empty() || command == "help") {
    std::fputs(OverviewHelp().c_str(), stdout);
    return 0;
  }
  const std::string text = CommandHelp(command);
  if (text.empty()) {
    std::fprintf(stderr, "gpipectl: unknown command '%s'\n\n%s",
                 command.c_str(), OverviewHelp().c_str());
    return 2;
  }
  std::fputs(text.c_str(), stdout);
  return 0;
}

}  // namespace gpipe::cli
