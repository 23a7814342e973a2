#include "cli/flag_checks.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cli/help.h"
#include "services/core/cores.h"
#include "services/core/flag_spelling.h"

ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(int64_t, stages);
ABSL_DECLARE_FLAG(int64_t, micro_batches);
ABSL_DECLARE_FLAG(int64_t, replicas);
ABSL_DECLARE_FLAG(int64_t, virtual_stages);
ABSL_DECLARE_FLAG(int64_t, workers);
ABSL_DECLARE_FLAG(int64_t, max_samples);
ABSL_DECLARE_FLAG(int64_t, top);
ABSL_DECLARE_FLAG(int64_t, top_k);
ABSL_DECLARE_FLAG(int64_t, tokens);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(double, flops);
ABSL_DECLARE_FLAG(double, layer_overhead_us);
ABSL_DECLARE_FLAG(double, measure_under);
ABSL_DECLARE_FLAG(double, memory_gbps);
ABSL_DECLARE_FLAG(absl::Duration, timeout);

namespace gpipe::cli {
namespace {

absl::Status Refuse(const std::string& flag, const std::string& want,
                    const std::string& got) {
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": must be ", want, ", got ", got));
}

absl::Status AtLeast(const std::string& flag, int64_t value, int64_t least,
                     const std::string& meaning) {
  if (value >= least) return absl::OkStatus();
  return Refuse(flag, absl::StrCat(">= ", least, meaning), absl::StrCat(value));
}

}  // namespace

absl::Status CheckNumericFlags(const std::string& command) {
  const int threads = absl::GetFlag(FLAGS_threads);
  if (threads < 0 || threads > kMaxThreads) {
    return Refuse(
        "--threads",
        absl::StrCat("between 0 (the usable cores) and ", kMaxThreads),
        absl::StrCat(threads));
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, int64_t>{"--stages",
                                        absl::GetFlag(FLAGS_stages)},
        {"--micro-batches", absl::GetFlag(FLAGS_micro_batches)},
        {"--replicas", absl::GetFlag(FLAGS_replicas)},
        {"--virtual-stages", absl::GetFlag(FLAGS_virtual_stages)},
        {"--workers", absl::GetFlag(FLAGS_workers)}}) {
    if (absl::Status s = AtLeast(flag, value, 0, " (0: the default)"); !s.ok())
      return s;
  }
  // Their 0 is no default: all tokens, and none generated.
  if (absl::Status s =
          AtLeast("--top-k", absl::GetFlag(FLAGS_top_k), 0, " (0: all tokens)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = AtLeast("--tokens", absl::GetFlag(FLAGS_tokens), 0, "");
      !s.ok()) {
    return s;
  }
  if (command == "local" && absl::GetFlag(FLAGS_workers) > kMaxLocalWorkers) {
    return Refuse("--workers",
                  absl::StrCat("at most ", kMaxLocalWorkers,
                               " (local starts a process per worker on this "
                               "machine)"),
                  absl::StrCat(absl::GetFlag(FLAGS_workers)));
  }
  if (absl::Status s =
          AtLeast("--max-samples", absl::GetFlag(FLAGS_max_samples), -1,
                  " (-1: the job's eval.max_samples)");
      !s.ok())
    return s;
  if (absl::Status s = AtLeast("--top", absl::GetFlag(FLAGS_top), 1, "");
      !s.ok())
    return s;
  if (const double t = absl::GetFlag(FLAGS_temperature);
      !std::isfinite(t) || t < 0) {
    return Refuse("--temperature", "a finite number >= 0", absl::StrCat(t));
  }
  if (const double f = absl::GetFlag(FLAGS_flops); !std::isfinite(f) || f < 0) {
    return Refuse("--flops", "a finite number >= 0 (0: measure here)",
                  absl::StrCat(f));
  }
  if (const double g = absl::GetFlag(FLAGS_memory_gbps);
      !std::isfinite(g) || g < 0) {
    return Refuse("--memory-gbps", "a finite number >= 0 (0: measure here)",
                  absl::StrCat(g));
  }
  if (const double us = absl::GetFlag(FLAGS_layer_overhead_us);
      !std::isfinite(us) || (us < 0 && us != -1)) {
    return Refuse("--layer-overhead-us",
                  "a finite number >= 0, or -1 (fitted or the default)",
                  absl::StrCat(us));
  }
  if (const double s = absl::GetFlag(FLAGS_measure_under);
      !std::isfinite(s) || s < 0) {
    return Refuse("--measure-under", "a finite number of seconds >= 0",
                  absl::StrCat(s));
  }
  if (const absl::Duration d = absl::GetFlag(FLAGS_timeout);
      d <= absl::ZeroDuration()) {
    return Refuse("--timeout", "positive", absl::FormatDuration(d));
  }
  return absl::OkStatus();
}

absl::Status MakeOutputDir(const std::string& flag, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": cannot make ", dir, " a directory",
        ec ? absl::StrCat(": ", ec.message()) : " (it is a file)"));
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot write in ", dir));
  }
  return absl::OkStatus();
}

int ExitCodeFor(const absl::Status& status) {
  if (status.ok()) return 0;
  // InvalidArgument: a value the flag does not take. A failure that names
  // its flag otherwise (--device cuda on a machine without a GPU, --out
  // once training ended) is not the command line's fault.
  return absl::IsInvalidArgument(status) &&
                 absl::StartsWith(status.message(), "--")
             ? 2
             : 1;
}

namespace {

// What `flag` takes, for a refusal: "a whole number >= 0", or absl's own
// words for a type not named here.
std::string KindOfValue(const absl::CommandLineFlag& flag,
                        const std::string& absl_error) {
  if (flag.IsOfType<bool>()) return "true or false";
  if (flag.IsOfType<int>())
    return "a whole number from -2147483648 to 2147483647";
  if (flag.IsOfType<int64_t>()) return "a whole number";
  if (flag.IsOfType<uint32_t>()) return "a whole number from 0 to 4294967295";
  if (flag.IsOfType<uint64_t>()) return "a whole number >= 0";
  if (flag.IsOfType<double>() || flag.IsOfType<float>()) return "a number";
  if (flag.IsOfType<absl::Duration>()) return "a duration (30s, 5m, 1h30m)";
  return absl::StrCat("a value it takes (", absl_error, ")");
}

absl::string_view FlagName(absl::string_view arg) {
  arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
  return arg.substr(0, arg.find('='));
}

// The flag as the user typed it, dashed, for errors: "--micro-batches".
std::string TypedName(absl::string_view arg) {
  return absl::StrCat(absl::StartsWith(arg, "--") ? "--" : "-",
                      absl::StrReplaceAll(FlagName(arg), {{"_", "-"}}));
}

// Whether the command line has a flag that brings flags from elsewhere or
// excuses unknown ones (--flagfile, --fromenv, --tryfromenv, --undefok):
// absl's parser alone knows what they make of the rest, so it checks all
// of it.
bool LeftToAbsl(int argc, char** argv) {
  for (int i = 1; i < argc && absl::string_view(argv[i]) != "--"; ++i) {
    if (!IsFlagArgument(argv[i])) continue;
    const absl::string_view name = FlagName(argv[i]);
    if (name == "flagfile" || name == "fromenv" || name == "tryfromenv" ||
        name == "undefok") {
      return true;
    }
  }
  return false;
}

}  // namespace

absl::Status CheckFlagSyntax(int argc, char** argv) {
  if (LeftToAbsl(argc, argv)) return absl::OkStatus();
  // absl's usage flags are handled by its parser, not registered as flags.
  constexpr absl::string_view kUsageFlags[] = {
      "help",    "helpfull",        "helpshort", "helppackage",
      "version", "only_check_args", "helpon",    "helpmatch"};
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;  // the flags end here
    if (!IsFlagArgument(arg)) continue;
    const absl::string_view name = FlagName(arg);
    std::optional<absl::string_view> value;
    if (const size_t eq = arg.find('='); eq != absl::string_view::npos) {
      value = arg.substr(eq + 1);
    }
    const std::string typed = TypedName(arg);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no") && !value) {
      // --nofoo: a boolean flag set false.
      absl::CommandLineFlag* positive =
          absl::FindCommandLineFlag(name.substr(2));
      if (positive != nullptr && positive->IsOfType<bool>()) continue;
    }
    if (flag == nullptr &&
        std::find(std::begin(kUsageFlags), std::end(kUsageFlags), name) !=
            std::end(kUsageFlags)) {
      continue;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(typed,
                       ": no such flag (gpipectl COMMAND --help lists a "
                       "command's flags)"));
    }
    if (!value) {
      if (flag->IsOfType<bool>()) continue;
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(
            absl::StrCat(typed, ": missing its value"));
      }
      value = argv[++i];
    }
    // `--step=$STEP` with STEP unset read as no --step at all (fetch then
    // downloaded the final model); a flag given must say something. The
    // prompt may be empty: generation from nothing.
    if (value->empty() && name != "prompt") {
      return absl::InvalidArgumentError(absl::StrCat(
          typed, ": an empty value (leave the flag out for its default)"));
    }
    // Parsed into the flag itself, as absl's parser then does again with
    // the same value.
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(
          typed, ": '", *value, "' is not ", KindOfValue(*flag, error)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckCommandTakesFlags(const std::string& command, int argc,
                                    char** argv) {
  const std::vector<const char*>* takes = CommandFlags(command);
  if (takes == nullptr) return absl::OkStatus();
  if (LeftToAbsl(argc, argv)) return absl::OkStatus();
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!IsFlagArgument(arg)) continue;
    absl::string_view name = FlagName(arg);
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      name.remove_prefix(2);  // --nofoo: a boolean flag set false
      flag = absl::FindCommandLineFlag(name);
    }
    if (flag == nullptr) continue;  // absl's usage flags
    // A value given apart is the next argument, not a flag.
    if (!flag->IsOfType<bool>() && arg.find('=') == absl::string_view::npos)
      ++i;
    if (!SomeCommandTakes(name) ||
        std::find_if(takes->begin(), takes->end(), [&](const char* f) {
          return name == f;
        }) != takes->end()) {
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat(
        TypedName(arg), ": ", command, " does not take this flag (gpipectl ",
        command, " --help lists its flags)"));
  }
  return absl::OkStatus();
}

void WarnAboutThreads(const std::string& command) {
  const int threads = absl::GetFlag(FLAGS_threads);
  const int cores = AvailableCores();
  if (threads <= cores) return;
  std::fprintf(stderr,
               "gpipectl %s: warning: --threads %d is more than the %d "
               "core%s this process may use; threads past them share cores "
               "and run slower, not faster\n",
               command.c_str(), threads, cores, cores == 1 ? "" : "s");
}

int FailCommand(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "gpipectl %s: %s\n", command,
               std::string(status.message()).c_str());
  return ExitCodeFor(status);
}

}  // namespace gpipe::cli
