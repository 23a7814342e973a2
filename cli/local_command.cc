// gpipectl local JOB.json: a whole cluster on this machine for one job. Starts
// gpipe-controller and K gpipe-workers as child processes (found next to
// gpipectl), submits the job, watches it with the progress bar, copies the
// final model to --out, and stops every process it started, also on Ctrl-C
// or when one of them dies.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/child_process.h"
#include "cli/commands.h"
#include "cli/controller_client.h"
#include "cli/flag_checks.h"
#include "services/core/bytes.h"
#include "services/core/cores.h"
#include "services/core/memory.h"
#include "services/core/status.h"
#include "services/pipeline/content_check.h"
#include "services/pipeline/data_resolution.h"
#include "services/pipeline/job_spec.h"
#include "services/storage/file_io.h"
#include "services/telemetry/trace_files.h"
#include "services/tensor/device.h"
#include "services/transport/data_plane.h"

ABSL_FLAG(int64_t, workers, 0,
          "local: worker processes to start (0: the job's stages x "
          "replicas); "
          "plan: the cluster's workers, to plan data-parallel replicas "
          "(0: one pipeline)");
ABSL_FLAG(bool, replace_workers, true,
          "local: start a new worker process when one dies, as a Deployment "
          "would, and let the controller recover the job (at most 10 "
          "times); --no-replace-workers: a dead worker stops the run");
ABSL_FLAG(std::string, keep, "",
          "local: run in this (new or empty) directory and keep its logs and "
          "checkpoints (default: a temporary directory, removed when the job "
          "succeeds)");
ABSL_FLAG(std::string, metrics_targets, "",
          "local: where to write the Prometheus file_sd targets of the local "
          "cluster's /metrics endpoints (default: OUT/prometheus-targets.json "
          "with --out, else in the run directory)");
ABSL_FLAG(std::string, ports, "",
          "local: FIRST-LAST, loopback ports to listen on, two a process in "
          "this order: the controller's API and /metrics, then each "
          "worker's; a replacement worker takes the ports of the one it "
          "replaces (default: any free ports the system gives)");
ABSL_FLAG(std::string, data_plane, "",
          "local: the workers' --data_plane (auto, grpc, shm or cuda_ipc; "
          "default: "
          "the workers' own default)");
// Defined with `gpipectl train` and the client commands.
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, trace);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(absl::Duration, timeout);

namespace gpipe::cli {
namespace {

namespace fs = std::filesystem;

constexpr absl::Duration kPortFileWait = absl::Seconds(20);
constexpr absl::Duration kAttachWait = absl::Seconds(30);
constexpr absl::Duration kStopGrace = absl::Seconds(5);
constexpr absl::Duration kPoll = absl::Milliseconds(50);
constexpr int kLogTailLines = 20;
constexpr absl::Duration kMetricsPortWait = absl::Seconds(10);

int Fail(const absl::Status& status) { return FailCommand("local", status); }

// The last `n` lines of a log file, each indented for quoting; no newline at
// the end.
std::string LogTail(const std::string& path, int n) {
  std::ifstream in(path);
  if (!in) return absl::StrCat("  (cannot read ", path, ")");
  std::deque<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(std::move(line));
    if (static_cast<int>(lines.size()) > n) lines.pop_front();
  }
  if (lines.empty()) return "  (empty)";
  std::string text;
  for (const std::string& line : lines) {
    if (!text.empty()) text += '\n';
    absl::StrAppend(&text, "  | ", line);
  }
  return text;
}

// An executable next to this gpipectl, else on PATH.
absl::StatusOr<std::string> FindBinary(const std::string& name) {
  std::string searched;
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n > 0) {
    self[n] = '\0';
    const fs::path dir = fs::path(self).parent_path();
    const std::string candidate = (dir / name).string();
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    searched = dir.string();
  }
  if (const char* path = std::getenv("PATH"); path != nullptr) {
    for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
      const std::string candidate = absl::StrCat(dir, "/", name);
      if (access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "cannot find ", name, searched.empty() ? "" : " next to gpipectl in ",
      searched, " or on PATH; build it with scripts/build.sh"));
}

// How a local cluster runs: from the command line once, then passed down.
struct LocalClusterOptions {
  std::string run_dir;          // logs, port files, checkpoints
  std::string data_plane;       // the workers' --data_plane ("": theirs)
  std::string device = "cpu";   // the workers' --device
  bool replace_workers = true;  // --replace_workers
  int first_port = 0;           // --ports' first, 0: any free port
};

// The ports `local` listens on, from --ports FIRST-LAST: a user whose
// firewall or neighbours leave only some ports free picks them. Two a
// process; an error names the range and what it needs.
absl::StatusOr<int> FirstPort(const std::string& range, int64_t workers) {
  if (range.empty()) return 0;
  const std::vector<std::string> ends = absl::StrSplit(range, '-');
  int first = 0, last = 0;
  if (ends.size() != 2 || !absl::SimpleAtoi(ends[0], &first) ||
      !absl::SimpleAtoi(ends[1], &last) || first < 1 || last > 65535 ||
      first > last) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ports: expected FIRST-LAST with 1 <= FIRST <= LAST <= 65535, got \"",
        range, "\""));
  }
  const int64_t needed = 2 * (1 + workers);
  if (last - first + 1 < needed) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ports ", range, " holds ", last - first + 1,
                     " ports; the controller and ", workers, " worker",
                     workers == 1 ? "" : "s", " need ", needed,
                     " (two each: the API and /metrics)"));
  }
  return first;
}

// Replacement workers one run may start: a worker that dies at once, again
// and again, is a problem to report, not to hide.
constexpr int kMaxReplacements = 10;

// Below this a worker's share of the machine is refused: a worker holds
// about 90 MiB of its own before any stage. Such shares were left to the
// workers' default, and 100 workers each advertised the whole machine.
constexpr int64_t kLeastWorkerMemory = int64_t{128} << 20;

// Why `workers` workers cannot share `shared` bytes (this machine's
// memory, or this process's cgroup limit: SharedMemoryLimit), or OK.
absl::Status WorkerShareError(int64_t workers, int64_t shared) {
  const int64_t each = shared / std::max<int64_t>(workers, 1);
  if (each >= kLeastWorkerMemory) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--workers: ", workers, " workers would have ", FormatBytes(each),
      " each of this machine's ", FormatBytes(shared), ", under the ",
      FormatBytes(kLeastWorkerMemory), " a worker needs; start fewer"));
}

// The controller and workers of one local run, stopped in order (workers
// first, so they detach from a live controller) when this object goes.
class LocalCluster {
 public:
  explicit LocalCluster(LocalClusterOptions options)
      : options_(std::move(options)), run_dir_(options_.run_dir) {}
  ~LocalCluster() { Stop(); }

  // Starts the controller and waits for the port it listens on.
  absl::Status StartController(const std::string& binary) {
    const std::string port_file = run_dir_ + "/controller.port";
    const std::string checkpoints = run_dir_ + "/checkpoints";
    std::error_code ec;
    fs::create_directories(checkpoints, ec);
    const std::string metrics_port_file = run_dir_ + "/controller.metrics.port";
    const std::vector<std::string> argv = {
        binary,
        "--listen=" + Loopback(0),
        "--port_file=" + port_file,
        "--checkpoint_dir=" + checkpoints,
        "--metrics_listen=" + Loopback(1),
        "--metrics_port_file=" + metrics_port_file};
    metrics_port_files_.emplace_back("controller", metrics_port_file);
    ASSIGN_OR_RETURN(controller_,
                     ChildProcess::Start("gpipe-controller", argv,
                                         run_dir_ + "/controller.log"));
    const absl::Time deadline = absl::Now() + kPortFileWait;
    for (;;) {
      int port = 0;
      if (ReadPort(port_file, &port)) {
        address_ = absl::StrCat("127.0.0.1:", port);
        return absl::OkStatus();
      }
      if (!controller_->Running()) return Died(*controller_);
      if (Interrupted()) return absl::CancelledError("interrupted");
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("gpipe-controller wrote no port file within ",
                         absl::FormatDuration(kPortFileWait),
                         "; the last lines of ", controller_->log_path(), ":\n",
                         LogTail(controller_->log_path(), kLogTailLines)));
      }
      absl::SleepFor(kPoll);
    }
  }

  absl::Status StartWorkers(const std::string& binary, int64_t count,
                            int threads_each, int64_t shared_memory) {
    worker_binary_ = binary;
    threads_each_ = threads_each;
    // The workers share this machine: each may use its share of the
    // memory (or of this process's cgroup limit), so that together they
    // advertise no more than there is. An address-space limit (ulimit -v)
    // is each worker's whole, not a share (they inherit it): where it is
    // no looser than the share, each worker measures its own room past its
    // own mappings (not this process's), as without --memory_limit.
    // (A share too small for a worker is refused before anything starts:
    // WorkerShareError.)
    memory_each_ = shared_memory / std::max<int64_t>(count, 1);
    if (AddressSpaceLimit() <= memory_each_) memory_each_ = 0;
    for (int64_t i = 0; i < count; ++i) {
      RETURN_IF_ERROR(StartWorker(absl::StrCat(i), i));
    }
    return absl::OkStatus();
  }

  // Starts a new process for every worker that ended, as a Deployment
  // would; the controller recovers the job onto it. Safe to call from the
  // watch's guard thread. False once kMaxReplacements are used up (or a
  // replacement cannot start): the dead worker then ends the run.
  bool ReplaceEndedWorkers() {
    std::vector<std::pair<std::string, int64_t>> ended;  // name, slot
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = workers_.begin(); it != workers_.end();) {
        if (it->process->Running()) {
          ++it;
          continue;
        }
        if (replacements_ >= kMaxReplacements) return false;
        ++replacements_;
        std::fprintf(stderr,
                     "gpipectl local: %s %s; starting a replacement (%d of "
                     "%d), as a Deployment would\n",
                     it->process->name().c_str(),
                     it->process->HowItEnded().c_str(), replacements_,
                     kMaxReplacements);
        ended.emplace_back(absl::StrCat("r", replacements_), it->slot);
        it = workers_.erase(it);  // reaped: it has ended
      }
    }
    for (const auto& [name, slot] : ended) {
      if (absl::Status s = StartWorker(name, slot, /*replacement=*/true);
          !s.ok()) {
        std::fprintf(stderr, "gpipectl local: %s\n", s.ToString().c_str());
        return false;
      }
    }
    return true;
  }

  bool replace_workers() const { return options_.replace_workers; }

  // One worker process, named `name` in its log and port files, on the
  // ports of `slot` with --ports; a replacement's metrics endpoint is in the
  // targets file only when it takes its predecessor's port (--ports): the
  // file was written before it started.
  absl::Status StartWorker(const std::string& name, int64_t slot,
                           bool replacement = false) {
    const std::string metrics_port_file =
        absl::StrCat(run_dir_, "/worker-", name, ".metrics.port");
    std::vector<std::string> args = {
        worker_binary_,
        "--controller=" + address_,
        "--listen=" + Loopback(2 + 2 * slot),
        absl::StrCat("--threads=", threads_each_),
        "--metrics_listen=" + Loopback(3 + 2 * slot),
        "--metrics_port_file=" + metrics_port_file};
    if (memory_each_ > 0) {
      args.push_back(absl::StrCat("--memory_limit=", memory_each_));
    }
    if (!options_.data_plane.empty()) {
      args.push_back("--data_plane=" + options_.data_plane);
    }
    // Where the stages compute (the --device of `gpipectl train`).
    if (options_.device != "cpu") {
      args.push_back("--device=" + options_.device);
    }
    if (!replacement)
      metrics_port_files_.emplace_back("worker", metrics_port_file);
    ASSIGN_OR_RETURN(
        std::unique_ptr<ChildProcess> worker,
        ChildProcess::Start(absl::StrCat("gpipe-worker ", name), args,
                            absl::StrCat(run_dir_, "/worker-", name, ".log")));
    std::lock_guard<std::mutex> lock(mu_);
    workers_.push_back({std::move(worker), slot});
    return absl::OkStatus();
  }

  // The controller, once it has ended (nullptr while it runs).
  ChildProcess* ControllerEnded() {
    std::lock_guard<std::mutex> lock(mu_);
    if (controller_ != nullptr && !controller_->Running())
      return controller_.get();
    return nullptr;
  }

  const std::string& address() const { return address_; }

  // The /metrics endpoints of every process as (role, host:port), once each
  // has written its port; an endpoint that did not within the wait is left
  // out (the job runs without it).
  std::vector<std::pair<std::string, std::string>> MetricsEndpoints() {
    std::vector<std::pair<std::string, std::string>> endpoints;
    const absl::Time deadline = absl::Now() + kMetricsPortWait;
    for (const auto& [role, path] : metrics_port_files_) {
      int port = 0;
      while (!ReadPort(path, &port) && absl::Now() < deadline && !Interrupted())
        absl::SleepFor(kPoll);
      if (port > 0) {
        endpoints.emplace_back(role, absl::StrCat("127.0.0.1:", port));
      } else {
        std::fprintf(stderr, "gpipectl local: no metrics port in %s\n",
                     path.c_str());
      }
    }
    return endpoints;
  }

  // The first process that has ended (nullptr while all run). Safe to call
  // from the watch's guard thread.
  ChildProcess* Ended() {
    std::lock_guard<std::mutex> lock(mu_);
    if (controller_ != nullptr && !controller_->Running())
      return controller_.get();
    for (auto& w : workers_)
      if (!w.process->Running()) return w.process.get();
    return nullptr;
  }

  // What to tell the user about a process that ended on its own.
  static absl::Status Died(const ChildProcess& child) {
    return absl::UnavailableError(
        absl::StrCat(child.name(), " ", child.HowItEnded(),
                     " unexpectedly; the last lines of ", child.log_path(),
                     ":\n", LogTail(child.log_path(), kLogTailLines)));
  }

  // SIGTERM to the workers, then the controller; SIGKILL to whatever is
  // still there after a grace period.
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_) w.process->Signal(SIGTERM);
    absl::Time deadline = absl::Now() + kStopGrace;
    for (auto& w : workers_) {
      if (!w.process->WaitUntil(deadline)) w.process->Signal(SIGKILL);
    }
    workers_.clear();  // reaps
    if (controller_ != nullptr) {
      controller_->Signal(SIGTERM);
      if (!controller_->WaitUntil(absl::Now() + kStopGrace))
        controller_->Signal(SIGKILL);
      controller_.reset();
    }
  }

 private:
  struct Worker {
    std::unique_ptr<ChildProcess> process;
    int64_t slot;  // its ports' place in --ports
  };

  // 127.0.0.1 and the `offset`th port of --ports, or any free port.
  std::string Loopback(int64_t offset) const {
    return absl::StrCat("127.0.0.1:", options_.first_port > 0
                                          ? options_.first_port + offset
                                          : 0);
  }

  // The port file holds the port, or host:port; it may be half-written.
  static bool ReadPort(const std::string& path, int* port) {
    std::ifstream in(path);
    if (!in) return false;
    std::string text((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
    absl::string_view v = absl::StripAsciiWhitespace(text);
    if (const size_t colon = v.rfind(':'); colon != absl::string_view::npos)
      v.remove_prefix(colon + 1);
    return absl::SimpleAtoi(v, port) && *port > 0 && *port < 65536;
  }

  const LocalClusterOptions options_;
  const std::string run_dir_;
  std::string address_;
  std::vector<std::pair<std::string, std::string>> metrics_port_files_;
  std::mutex mu_;
  std::unique_ptr<ChildProcess> controller_;
  std::vector<Worker> workers_;
  std::string worker_binary_;
  int threads_each_ = 1;
  int64_t memory_each_ = 0;  // --memory_limit of each worker
  int replacements_ = 0;
};

// Waits until `count` workers have attached to the controller.
absl::Status WaitForWorkers(ControllerClient& client, LocalCluster& cluster,
                            int64_t count) {
  const absl::Time deadline = absl::Now() + kAttachWait;
  int64_t attached = 0;
  absl::Status last = absl::OkStatus();
  for (;;) {
    absl::StatusOr<gpipe::v1::ListWorkersResponse> list = client.ListWorkers();
    if (list.ok()) {
      attached = list->workers_size();
      if (attached >= count) return absl::OkStatus();
    } else {
      last = list.status();
    }
    if (ChildProcess* c = cluster.Ended(); c != nullptr)
      return LocalCluster::Died(*c);
    if (Interrupted()) return absl::CancelledError("interrupted");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "only ", attached, " of ", count, " workers attached within ",
          absl::FormatDuration(kAttachWait),
          last.ok() ? "" : absl::StrCat(" (", last.message(), ")")));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

// A new temporary directory, or --keep's (created; refused when it holds
// files, so an old run's checkpoints are never picked up).
absl::StatusOr<std::string> MakeRunDir(const std::string& keep) {
  if (keep.empty()) {
    char tmpl[] = "/tmp/gpipe-local-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      return absl::UnavailableError(absl::StrCat(
          "cannot create a directory under /tmp: ", std::strerror(errno)));
    }
    return std::string(tmpl);
  }
  std::error_code ec;
  fs::create_directories(keep, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("--keep: cannot create ", keep, ": ", ec.message()));
  }
  if (!fs::is_empty(keep, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--keep: ", keep, " is not empty; give a new or empty directory"));
  }
  return fs::absolute(keep).lexically_normal().string();
}

absl::Status CopyModel(const std::string& model_path, const std::string& out) {
  if (model_path.empty())
    return absl::DataLossError("the controller reported no model path");
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("--out: cannot create ", out, ": ", ec.message()));
  }
  const std::string target = out + "/model.safetensors";
  fs::copy_file(model_path, target, fs::copy_options::overwrite_existing, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "cannot copy ", model_path, " to ", target, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// A Prometheus file_sd file: one group per role, labelled `role`. Written
// through a rename so that Prometheus never reads half a file.
absl::Status WriteTargets(
    const std::string& path,
    const std::vector<std::pair<std::string, std::string>>& endpoints) {
  std::string json = "[";
  for (const char* role : {"controller", "worker"}) {
    std::string targets;
    for (const auto& [r, address] : endpoints) {
      if (r != role) continue;
      absl::StrAppend(&targets, targets.empty() ? "" : ", ", "\"", address,
                      "\"");
    }
    if (targets.empty()) continue;
    absl::StrAppend(&json, json.size() > 1 ? ",\n " : "\n ", "{\"targets\": [",
                    targets, "], \"labels\": {\"role\": \"", role, "\"}}");
  }
  json += "\n]\n";
  if (absl::Status s = storage::WriteFileAtomically(path, json); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--metrics-targets: ", s.message()));
  }
  return absl::OkStatus();
}

// Whether WriteTargets can write `path`: its directory is there and
// writable (the file is written through a temporary file beside it).
absl::Status CheckTargetsWritable(const std::string& path) {
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-targets: cannot create ", path, ": ",
                     dir.string(), " is not a directory"));
  }
  if (fs::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-targets: ", path, " is a directory"));
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-targets: cannot create ", path,
                     ": cannot write in ", dir.string()));
  }
  return absl::OkStatus();
}

// Everything between starting the processes and stopping them; the exit code.
int RunJob(const gpipe::v1::JobSpec& spec, LocalCluster& cluster,
           int64_t workers, const std::string& targets_path, bool* keep_logs) {
  ControllerClient client(cluster.address(), absl::GetFlag(FLAGS_timeout));
  *keep_logs = true;
  if (absl::Status s = WaitForWorkers(client, cluster, workers); !s.ok())
    return Fail(s);
  if (absl::Status s = WriteTargets(targets_path, cluster.MetricsEndpoints());
      !s.ok()) {
    return Fail(s);
  }
  if (!absl::GetFlag(FLAGS_json)) {
    std::printf("metrics: Prometheus file_sd targets in %s\n",
                targets_path.c_str());
  }
  absl::StatusOr<gpipe::v1::Job> submitted = client.SubmitJob(spec);
  if (!submitted.ok()) return Fail(submitted.status());
  const std::string id = submitted->id();
  const bool json = absl::GetFlag(FLAGS_json);
  if (!json) {
    std::printf("submitted %s to the local controller at %s\n", id.c_str(),
                cluster.address().c_str());
    std::fflush(stdout);
  }

  // A dead worker is replaced (the controller recovers the job onto the new
  // one); a dead controller, or a worker past the replacements, ends the run.
  const auto stopped = [&] {
    if (Interrupted()) return true;
    if (!cluster.replace_workers()) return cluster.Ended() != nullptr;
    return cluster.ControllerEnded() != nullptr ||
           !cluster.ReplaceEndedWorkers();
  };
  // The controller's model path outlives this command only under --keep;
  // else the model is where --out copies it, or nowhere.
  std::optional<std::string> model_path;
  if (absl::GetFlag(FLAGS_keep).empty()) {
    const std::string out = absl::GetFlag(FLAGS_out);
    model_path = out.empty() ? "" : out + "/model.safetensors";
  }
  absl::StatusOr<gpipe::v1::Job> job =
      FollowJob(client, id, json, stopped, std::move(model_path));
  if (!job.ok()) {
    if (ChildProcess* c = cluster.Ended(); c != nullptr) {
      Fail(LocalCluster::Died(*c));
    } else if (Interrupted()) {
      std::fprintf(stderr, "gpipectl local: interrupted; cancelling %s\n",
                   id.c_str());
      *keep_logs = false;
    } else {
      Fail(job.status());
    }
    // Best effort: the processes stop next anyway.
    if (cluster.Ended() == nullptr) (void)client.CancelJob(id);
    return 1;
  }
  // The timelines tell most about a job that failed, too.
  if (const std::string dir = absl::GetFlag(FLAGS_trace); !dir.empty()) {
    if (absl::Status s = WriteJobTraceDir(client, id, dir); !s.ok()) {
      std::fprintf(stderr, "gpipectl local: --trace: %s\n",
                   std::string(s.message()).c_str());
      if (job->status().state() == gpipe::v1::SUCCEEDED) return 1;
    } else if (!json) {
      std::printf("wrote %s\n", TraceDirFiles(dir).c_str());
    }
  }
  if (job->status().state() != gpipe::v1::SUCCEEDED) {
    // A process that died may be why.
    if (ChildProcess* c = cluster.Ended(); c != nullptr)
      Fail(LocalCluster::Died(*c));
    return 1;
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    if (absl::Status s = CopyModel(job->status().model_path(), out); !s.ok())
      return Fail(s);
    if (!json) std::printf("wrote %s/model.safetensors\n", out.c_str());
  } else if (!json && absl::GetFlag(FLAGS_keep).empty()) {
    std::printf("the model goes with the local cluster: --out DIR keeps it\n");
  }
  *keep_logs = false;
  return 0;
}

}  // namespace

int RunLocal(const std::vector<std::string>& args) {
  if (args.size() != 1) {
    std::fprintf(stderr,
                 "usage: gpipectl local JOB.json [--workers N] [--stages K] "
                 "[--replicas R] [--micro-batches M] "
                 "[--schedule gpipe|1f1b|zb-h1|interleaved|zb-v] "
                 "[--virtual-stages V] "
                 "[--remat always|except_last|never] [--steps N] [--out DIR] "
                 "[--threads T] [--keep DIR] [--metrics_targets FILE] "
                 "[--trace DIR] [--data_plane auto|grpc|shm|cuda_ipc] "
                 "[--ports FIRST-LAST] "
                 "[--device cpu|cuda|auto] [--no-replace-workers]\n");
    return 2;
  }
  // The workers may run elsewhere (--keep directories): paths mean here.
  absl::StatusOr<gpipe::v1::JobSpec> spec = LoadSpecWithFlags(args[0]);
  if (!spec.ok()) return Fail(spec.status());
  // The data's values and the starting weights checked before any process
  // starts, as train reads them: a NaN feature, a label past the head's
  // classes, a text file named as initFrom or weights of other shapes
  // failed the job only once the cluster had started and the controller
  // read them (and left the run directory behind). The same check the
  // controller makes (CheckJobContents), within the memory its check may
  // take by default (larger files are the stages' to check, each its own
  // share), and that memory given back before the workers start.
  constexpr int64_t kCheckMaxBytes = int64_t{1} << 30;
  const absl::StatusOr<std::optional<int64_t>> check_bytes =
      ContentCheckBytes(*spec);
  if (check_bytes.ok() && check_bytes->has_value() &&
      **check_bytes <= kCheckMaxBytes) {
    const absl::Status contents = CheckJobContents(*spec);
    ReleaseFreedMemory();
    if (!contents.ok()) return Fail(contents);
  }
  // The device the workers are told, refused here as train refuses it: a
  // worker exited with status 2 after the cluster had started.
  if (absl::StatusOr<Device> device =
          ResolveDevice(absl::GetFlag(FLAGS_device));
      !device.ok()) {
    return Fail(device.status());
  }
  // The workers' own parser: what they accept is what is accepted here.
  if (const std::string plane = absl::GetFlag(FLAGS_data_plane);
      !plane.empty()) {
    if (absl::StatusOr<DataPlaneMode> mode = ParseDataPlaneMode(plane);
        !mode.ok()) {
      return Fail(mode.status());
    }
  }
  // Replicas run K x R workers, all at once.
  const int64_t stages = StageCount(*spec) * ReplicaCount(*spec);
  const int64_t workers =
      absl::GetFlag(FLAGS_workers) > 0 ? absl::GetFlag(FLAGS_workers) : stages;
  if (workers < stages) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--workers ", workers, " is fewer than the job's ", stages,
        ReplicaCount(*spec) > 1
            ? absl::StrCat(" workers (", StageCount(*spec), " stages x ",
                           ReplicaCount(*spec), " replicas)")
            : " stages")));
  }
  // Read once: the check and the workers' shares agree.
  const int64_t shared_memory = SharedMemoryLimit();
  if (absl::Status s = WorkerShareError(workers, shared_memory); !s.ok())
    return Fail(s);
  const int threads = absl::GetFlag(FLAGS_threads) > 0
                          ? absl::GetFlag(FLAGS_threads)
                          : gpipe::AvailableCores();
  const int threads_each =
      std::max<int>(1, threads / static_cast<int>(workers));
  // The workers share this host's cores: their compute threads sleep at
  // barriers rather than spin while a neighbour waits for the core
  // (docs/deploy.md, "Cores and threads"). A user's own setting is kept.
  // Only children read it; our own OpenMP runtime has started already.
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/0);

  const absl::StatusOr<int> first_port =
      FirstPort(absl::GetFlag(FLAGS_ports), workers);
  if (!first_port.ok()) return Fail(first_port.status());

  absl::StatusOr<std::string> controller_bin = FindBinary("gpipe-controller");
  if (!controller_bin.ok()) return Fail(controller_bin.status());
  absl::StatusOr<std::string> worker_bin = FindBinary("gpipe-worker");
  if (!worker_bin.ok()) return Fail(worker_bin.status());

  const std::string keep = absl::GetFlag(FLAGS_keep);
  absl::StatusOr<std::string> run_dir = MakeRunDir(keep);
  if (!run_dir.ok()) return Fail(run_dir.status());
  // Where the results go is made now, before anything starts; a refusal
  // takes the temporary run directory with it (an empty one was left
  // behind on every refused --out).
  const auto refuse = [&](const absl::Status& s) {
    if (keep.empty()) {
      std::error_code ec;
      fs::remove_all(*run_dir, ec);
    }
    return Fail(s);
  };
  const std::string out = absl::GetFlag(FLAGS_out);
  if (!out.empty()) {
    if (absl::Status s = MakeOutputDir("--out", out); !s.ok()) return refuse(s);
  }
  if (const std::string dir = absl::GetFlag(FLAGS_trace); !dir.empty()) {
    if (absl::Status s = MakeOutputDir("--trace", dir); !s.ok())
      return refuse(s);
  }
  std::string targets_path = absl::GetFlag(FLAGS_metrics_targets);
  if (!targets_path.empty()) {
    // A path it cannot be written at was found only once the processes had
    // started. Not written yet: a script may wait for the file to appear
    // as the sign that the cluster's endpoints are up.
    if (absl::Status s = CheckTargetsWritable(targets_path); !s.ok())
      return refuse(s);
  } else {
    targets_path = (out.empty() ? *run_dir : out) + "/prometheus-targets.json";
  }

  InstallInterruptHandlers();
  int code = 1;
  bool keep_logs = true;
  {
    LocalClusterOptions cluster_options;
    cluster_options.run_dir = *run_dir;
    cluster_options.data_plane = absl::GetFlag(FLAGS_data_plane);
    cluster_options.device = absl::GetFlag(FLAGS_device);
    cluster_options.replace_workers = absl::GetFlag(FLAGS_replace_workers);
    cluster_options.first_port = *first_port;
    LocalCluster cluster(std::move(cluster_options));
    absl::Status s = cluster.StartController(*controller_bin);
    if (s.ok()) {
      s = cluster.StartWorkers(*worker_bin, workers, threads_each,
                               shared_memory);
    }
    if (!s.ok()) {
      if (!absl::IsCancelled(s)) Fail(s);
      keep_logs = !absl::IsCancelled(s);
    } else {
      if (!absl::GetFlag(FLAGS_json)) {
        std::printf(
            "local cluster: controller %s, %lld workers (%d thread%s each), "
            "run directory %s\n",
            cluster.address().c_str(), static_cast<long long>(workers),
            threads_each, threads_each == 1 ? "" : "s", run_dir->c_str());
        std::fflush(stdout);
      }
      code = RunJob(*spec, cluster, workers, targets_path, &keep_logs);
    }
  }  // stops every process
  // The endpoints are gone: an empty group list tells Prometheus so (and
  // keeps "target down" alerts quiet).
  if (fs::exists(targets_path)) (void)WriteTargets(targets_path, {});
  if (!keep.empty()) {
    if (!absl::GetFlag(FLAGS_json))
      std::printf("logs and checkpoints kept in %s\n", run_dir->c_str());
  } else if (keep_logs) {
    std::fprintf(stderr, "gpipectl local: logs kept in %s\n", run_dir->c_str());
  } else {
    std::error_code ec;
    fs::remove_all(*run_dir, ec);
  }
  return code;
}

}  // namespace gpipe::cli
