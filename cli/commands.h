// The subcommands of gpipectl; each returns the process exit code.
#ifndef GPIPE_CLI_COMMANDS_H_
#define GPIPE_CLI_COMMANDS_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/controller.pb.h"
#include "services/pipeline/trainer.h"

namespace gpipe::cli {

class ControllerClient;

int RunTrain(const std::vector<std::string>& args);
int RunPlan(const std::vector<std::string>& args);
// Using a trained model file (eval_command.cc, predict_command.cc).
int RunEval(const std::vector<std::string>& args);
int RunPredict(const std::vector<std::string>& args);
int RunGenerate(const std::vector<std::string>& args);

// The trainer train's flags ask for (--stages, --micro_batches, --schedule,
// --remat, --balance, --device): the reference trainer for one stage, the
// in-process pipeline otherwise; `description` says which.
absl::StatusOr<std::unique_ptr<Trainer>> MakeTrainer(
    const gpipe::v1::JobSpec& spec, int threads, std::string* description);

// Talking to a controller (client_commands.cc).
int RunSubmit(const std::vector<std::string>& args);
int RunStatus(const std::vector<std::string>& args);
int RunList(const std::vector<std::string>& args);
int RunWatch(const std::vector<std::string>& args);
int RunCancel(const std::vector<std::string>& args);
int RunDelete(const std::vector<std::string>& args);
int RunFetch(const std::vector<std::string>& args);
int RunResume(const std::vector<std::string>& args);
int RunWorkers(const std::vector<std::string>& args);
// Stage timelines of a job as Chrome trace JSON or SVG (trace_command.cc).
int RunTrace(const std::vector<std::string>& args);

// The client of the controller that --controller (else $GPIPE_CONTROLLER,
// else 127.0.0.1:7070) and --timeout name.
ControllerClient MakeControllerClient();

// That address's port in range, naming where it came from: gRPC dialled a
// port past 65535 modulo 65536, another controller's perhaps.
absl::Status CheckControllerAddress();

// --steps as a step count (train, submit, local): 0 when not given.
absl::StatusOr<int64_t> StepCountFlag();

// How many of the last kept steps `--trace DIR` writes (train and local).
inline constexpr int64_t kTraceDirSteps = 4;
// Fetches the last kTraceDirSteps kept steps of `job_id` and writes
// DIR/trace.json and DIR/timeline.svg.
absl::Status WriteJobTraceDir(ControllerClient& client,
                              const std::string& job_id,
                              const std::string& dir);

// A controller and workers on this machine, for one job (local_command.cc).
int RunLocal(const std::vector<std::string>& args);

// Shared by `watch`, `submit --watch` and `local`: follows a job to its end
// with a progress bar (plain lines when not on a terminal) and a line per
// state change, then prints the final state, evaluation and model path
// (with `json`: each event as one line of protobuf JSON instead). Stops early
// when `stop` returns true. Returns the job as last seen. `model_path`: where
// the user finds the model when that is not the controller's path (`local`
// removes its run directory: its --out's file, or "" when the model goes
// with the cluster): the summary does not print the controller's, and the
// JSON events name this one instead.
absl::StatusOr<gpipe::v1::Job> FollowJob(
    ControllerClient& client, const std::string& job_id, bool json,
    const std::function<bool()>& stop,
    std::optional<std::string> model_path = std::nullopt);

// The spec in `path` with --stages, --micro-batches, --replicas,
// --schedule, --virtual-stages, --remat, --balance and --steps applied,
// then checked (CheckJobSpec; its errors name the file): what the job runs,
// and what its model file records (train, local and submit record the same
// spec for the same flags). The file alone need not be valid: --replicas 2
// makes a spec whose gradient_groups is 2 runnable. Relative data paths
// mean this directory (the workers may run elsewhere). A --stages of
// another K drops the spec's balance (cut for its own K) unless --balance
// gives one. `measured_balance` (train): --balance measured is the
// caller's to apply (train measures its layers), and pipeline.min_stages,
// which only an elastic cluster uses, is lowered to --stages; otherwise
// --balance measured is refused.
absl::StatusOr<gpipe::v1::JobSpec> LoadSpecWithFlags(
    const std::string& path, bool measured_balance = false);

// Ctrl-C and SIGTERM set a flag instead of killing gpipectl, so that a watch
// ends cleanly and `local` stops its processes; a second one kills at once.
void InstallInterruptHandlers();
bool Interrupted();

}  // namespace gpipe::cli

#endif  // GPIPE_CLI_COMMANDS_H_
