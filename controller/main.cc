// gpipe-controller: accepts jobs, assigns their stages to attached workers,
// watches their leases and merges their final parameters.
#include <pthread.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "controller/controller_server.h"
#include "services/core/flag_spelling.h"
#include "services/core/flags_help.h"
#include "services/core/host_port.h"
#include "services/core/log.h"
#include "services/core/status.h"
#include "services/security/tls.h"
#include "services/security/tls_flags.h"
#include "services/security/token_file.h"
#include "services/storage/file_io.h"
#include "services/telemetry/controller_metrics.h"
#include "services/telemetry/metrics_server.h"
#include "services/telemetry/port_file.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "host:port to serve on; port 0 picks a free one");
ABSL_FLAG(std::string, port_file, "",
          "if set, the bound port is written there once the server is up");
ABSL_FLAG(std::string, checkpoint_dir, "./gpipe-checkpoints",
          "where jobs' checkpoints and final models go");
ABSL_FLAG(std::string, checkpoint_transport, "controller",
          "how stages' checkpoints and final parameters reach "
          "--checkpoint_dir: \"controller\" (uploaded through this "
          "controller's API; workers need no shared disk) or "
          "\"shared_path\" (stages write there themselves: every worker "
          "mounts the same directory at the same path)");
ABSL_FLAG(int32_t, max_transfers, 8,
          "checkpoint uploads and fetches served at once (through the "
          "controller); more wait");
ABSL_FLAG(bool, check_data_paths, true,
          "refuse a job whose data or init_from path does not exist here, "
          "and fill in what only the data says (a 0 vocab_size, CSV "
          "standardization); false where the controller mounts no data");
ABSL_FLAG(int64_t, check_contents_max_bytes, int64_t{1} << 30,
          "with --check_data_paths, read a submitted job's data and "
          "init_from weights value by value before it is scheduled when "
          "that holds at most this many bytes of memory (data files count "
          "5 times: read and converted; the model's state 3 times); larger "
          "ones are checked by the stages; 0: never");
ABSL_FLAG(std::string, store, "",
          "SQLite job store (WAL): jobs survive a restart of the controller; "
          "empty: in memory only");
ABSL_FLAG(absl::Duration, job_retention, absl::Hours(24 * 7),
          "ended jobs are deleted (record, checkpoints, model) this long "
          "after they ended; 0: kept until `gpipectl delete`");
ABSL_FLAG(int64_t, heartbeat_timeout_ms, 10000,
          "a worker silent for longer is lost");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 1000,
          "how often workers are told to send a heartbeat");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "HOST:PORT of the Prometheus /metrics endpoint (empty: off; port 0: "
          "a free port)");
ABSL_FLAG(bool, metrics_optional, false,
          "serve without metrics when --metrics_listen cannot be bound "
          "(default: exit 1, as for a taken gRPC port)");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, the bound metrics port is written there once it serves");

ABSL_FLAG(int64_t, trace_steps, 16,
          "stage timelines kept per job and stage for GetTrace (the last N "
          "steps)");
ABSL_FLAG(int64_t, trace_jobs, 32,
          "jobs whose stage timelines are kept (the most recently active)");

// Security (docs/security.md). Without these everything is plaintext and
// open, as a local cluster wants it. --tls_cert, --tls_key and --tls_ca:
// services/security/tls_flags.h.
ABSL_FLAG(std::string, api_token_file, "",
          "bearer tokens (one per line, # comments) that the job API "
          "(submit, status, list, watch, cancel, resume, delete, workers, "
          "trace, fetch) requires");
ABSL_FLAG(std::string, worker_token_file, "",
          "bearer tokens (one per line, # comments) that workers must "
          "present to attach");
ABSL_FLAG(std::string, health_listen, "",
          "HOST:PORT of a plaintext port serving only grpc.health.v1, for "
          "probes that cannot speak TLS (empty: off)");

namespace {

// The tokens in the file --<flag> names; without the flag, none are
// required.
absl::StatusOr<gpipe::security::TokenVerifier> LoadTokenVerifier(
    const char* flag, const std::string& path) {
  if (path.empty()) return gpipe::security::TokenVerifier();
  ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                   gpipe::security::ReadTokenFile(flag, path));
  return gpipe::security::TokenVerifier(std::move(tokens));
}

// The security flags as server options; errors name the flag and file.
absl::Status LoadSecurity(gpipe::controller::ControllerServerOptions& options) {
  ASSIGN_OR_RETURN(const std::optional<gpipe::security::TlsMaterial> tls,
                   gpipe::security::ServerTlsFromFlags());
  if (tls.has_value()) {
    options.credentials = gpipe::security::MakeServerCredentials(tls);
  }
  ASSIGN_OR_RETURN(
      options.auth.api,
      LoadTokenVerifier("api_token_file", absl::GetFlag(FLAGS_api_token_file)));
  ASSIGN_OR_RETURN(options.auth.workers,
                   LoadTokenVerifier("worker_token_file",
                                     absl::GetFlag(FLAGS_worker_token_file)));
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  if (!options.health_listen.empty()) {
    return gpipe::CheckListenAddress("health_listen", options.health_listen);
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  gpipe::SpellFlagsForAbsl(argc, argv);  // --checkpoint-dir as well
  gpipe::ListProjectFlagsInHelp(argv[0]);
  absl::SetProgramUsageMessage(
      "gpipe-controller [--listen 127.0.0.1:7070] [--port_file FILE]\n"
      "                 [--checkpoint_dir DIR] [--checkpoint_transport "
      "controller|shared_path]\n"
      "                 [--heartbeat_timeout_ms N]\n"
      "                 [--heartbeat_interval_ms N] [--metrics_listen "
      "HOST:PORT]\n"
      "                 [--trace_steps 16] [--trace_jobs 32] [--store FILE]");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (absl::Status s = gpipe::CheckNoArguments("gpipe-controller", rest);
      !s.ok()) {
    std::fprintf(stderr, "gpipe-controller: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  if (absl::Status s =
          gpipe::CheckPortInRange("--listen", absl::GetFlag(FLAGS_listen));
      !s.ok()) {
    std::fprintf(stderr, "gpipe-controller: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_job_retention) < absl::ZeroDuration()) {
    std::fprintf(
        stderr,
        "gpipe-controller: --job_retention must not be negative (0: "
        "kept until gpipectl delete), got %s\n",
        absl::FormatDuration(absl::GetFlag(FLAGS_job_retention)).c_str());
    return 2;
  }
  const int64_t timeout_ms = absl::GetFlag(FLAGS_heartbeat_timeout_ms);
  const int64_t interval_ms = absl::GetFlag(FLAGS_heartbeat_interval_ms);
  if (absl::GetFlag(FLAGS_trace_steps) < 1 ||
      absl::GetFlag(FLAGS_trace_jobs) < 1) {
    std::fprintf(stderr,
                 "gpipe-controller: --trace_steps and --trace_jobs must be at "
                 "least 1\n");
    return 2;
  }
  if (timeout_ms <= 0 || interval_ms <= 0) {
    std::fprintf(stderr,
                 "gpipe-controller: --heartbeat_timeout_ms and "
                 "--heartbeat_interval_ms must be positive\n");
    return 2;
  }
  // Workers beat at the interval: one at or past the timeout loses every
  // idle worker between two beats.
  if (interval_ms >= timeout_ms) {
    std::fprintf(stderr,
                 "gpipe-controller: --heartbeat_interval_ms (%lld) must be "
                 "less than --heartbeat_timeout_ms (%lld)\n",
                 static_cast<long long>(interval_ms),
                 static_cast<long long>(timeout_ms));
    return 2;
  }
  const std::string transport = absl::GetFlag(FLAGS_checkpoint_transport);
  if (transport != "controller" && transport != "shared_path") {
    std::fprintf(stderr,
                 "gpipe-controller: --checkpoint_transport is \"%s\"; want "
                 "controller or shared_path\n",
                 transport.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_max_transfers) < 1) {
    std::fprintf(stderr,
                 "gpipe-controller: --max_transfers must be at least 1\n");
    return 2;
  }
  if (absl::GetFlag(FLAGS_check_contents_max_bytes) < 0) {
    std::fprintf(stderr,
                 "gpipe-controller: --check_contents_max_bytes must not be "
                 "negative (0: never)\n");
    return 2;
  }
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!metrics_listen.empty()) {
    if (absl::Status s =
            gpipe::CheckListenAddress("metrics_listen", metrics_listen);
        !s.ok()) {
      std::fprintf(stderr, "gpipe-controller: %s\n",
                   std::string(s.message()).c_str());
      return 2;
    }
  }

  // SIGTERM and SIGINT are taken by sigwait below: block them before any
  // thread starts, so every thread inherits the mask. A shell starts
  // background jobs with SIGINT ignored, and an ignored signal never reaches
  // sigwait: restore the default first.
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  gpipe::controller::ControllerServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  if (absl::Status s = LoadSecurity(options); !s.ok()) {
    std::fprintf(stderr, "gpipe-controller: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  std::error_code error;
  const std::filesystem::path dir =
      std::filesystem::absolute(absl::GetFlag(FLAGS_checkpoint_dir), error);
  options.controller.checkpoint_dir = error
                                          ? absl::GetFlag(FLAGS_checkpoint_dir)
                                          : dir.lexically_normal().string();
  options.controller.heartbeat_timeout = absl::Milliseconds(timeout_ms);
  options.controller.heartbeat_interval = absl::Milliseconds(interval_ms);
  auto metrics = std::make_shared<gpipe::ControllerMetrics>();
  options.controller.metrics = metrics.get();
  options.controller.trace_steps = absl::GetFlag(FLAGS_trace_steps);
  options.controller.trace_jobs = absl::GetFlag(FLAGS_trace_jobs);
  options.controller.store_path = absl::GetFlag(FLAGS_store);
  options.controller.job_retention = absl::GetFlag(FLAGS_job_retention);
  options.controller.checkpoint_transport =
      transport == "controller" ? gpipe::v1::CHECKPOINT_TRANSPORT_CONTROLLER
                                : gpipe::v1::CHECKPOINT_TRANSPORT_SHARED_PATH;
  options.controller.transfers.max_concurrent =
      absl::GetFlag(FLAGS_max_transfers);
  options.controller.check_data_paths = absl::GetFlag(FLAGS_check_data_paths);
  options.controller.private_files = {
      absl::GetFlag(FLAGS_api_token_file),
      absl::GetFlag(FLAGS_worker_token_file),
      gpipe::security::TlsFlagsFromCommandLine().key};
  // The store holds every user's jobs; SQLite keeps some beside it.
  if (const std::string store = absl::GetFlag(FLAGS_store); !store.empty()) {
    for (const char* suffix : {"", "-wal", "-shm", "-journal", ".lock"})
      options.controller.private_files.push_back(store + suffix);
  }
  options.controller.content_check_bytes =
      absl::GetFlag(FLAGS_check_contents_max_bytes);

  // Stages' files and the manifests land here however they travel.
  // A full one is not refused: the jobs on it wait for room, and a
  // controller that cannot start cannot delete one to make it.
  if (absl::Status writable = gpipe::storage::CheckWritableDirectory(
          options.controller.checkpoint_dir);
      absl::IsResourceExhausted(writable)) {
    gpipe::LogWarning("gpipe-controller: --checkpoint_dir: %s",
                      std::string(writable.message()));
  } else if (!writable.ok()) {
    gpipe::LogError("gpipe-controller: --checkpoint_dir: %s",
                    std::string(writable.message()));
    return 1;
  }
  auto server = gpipe::controller::ControllerServer::Start(options);
  if (!server.ok()) {
    gpipe::LogError("gpipe-controller: %s", server.status().ToString());
    return 1;
  }
  const std::string port_file = absl::GetFlag(FLAGS_port_file);
  if (!port_file.empty()) {
    if (absl::Status written =
            gpipe::WritePortFile(port_file, (*server)->port());
        !written.ok()) {
      gpipe::LogError("gpipe-controller: %s", written.ToString());
      return 1;
    }
  }
  gpipe::LogInfo("gpipe-controller listening on %s (checkpoints in %s, %s)",
                 (*server)->address(), options.controller.checkpoint_dir,
                 transport == "controller"
                     ? "uploaded through the controller"
                     : "written by the stages on a shared path");
  const bool mutual_tls =
      !gpipe::security::TlsFlagsFromCommandLine().ca.empty();
  gpipe::LogInfo("gpipe-controller security: %s, job API %s, Attach %s%s",
                 options.credentials != nullptr
                     ? (mutual_tls ? "mutual TLS" : "TLS")
                     : "plaintext",
                 options.auth.api.enabled() ? "needs a token" : "open",
                 options.auth.workers.enabled() ? "needs a token" : "open",
                 (*server)->health_port() != 0
                     ? absl::StrCat(", plaintext health on port ",
                                    (*server)->health_port())
                     : std::string());

  // Declared after the server, so it stops scraping the controller first.
  std::unique_ptr<gpipe::MetricsServer> metrics_server;
  if (!metrics_listen.empty()) {
    gpipe::controller::Controller* controller = &(*server)->controller();
    metrics->SetCounts([controller] { return controller->Counts(); });
    absl::StatusOr<std::unique_ptr<gpipe::MetricsServer>> started =
        gpipe::MetricsServer::Start(metrics_listen, {metrics});
    if (started.ok()) {
      metrics_server = *std::move(started);
      gpipe::LogInfo("gpipe-controller metrics on http://%s/metrics",
                     metrics_server->address());
      const std::string f = absl::GetFlag(FLAGS_metrics_port_file);
      if (!f.empty()) {
        if (absl::Status w = gpipe::WritePortFile(f, metrics_server->port());
            !w.ok()) {
          gpipe::LogError("gpipe-controller: %s", w.ToString());
          return 1;
        }
      }
    } else if (absl::GetFlag(FLAGS_metrics_optional)) {
      gpipe::LogWarning(
          "gpipe-controller: %s; serving without metrics "
          "(--metrics_optional)",
          std::string(started.status().message()));
    } else {
      // A controller nobody can observe is not what was asked for: fail as
      // a taken gRPC port does, and say how to run without metrics.
      gpipe::LogError(
          "gpipe-controller: %s (--metrics_listen \"\" turns metrics off; "
          "--metrics_optional serves without them)",
          std::string(started.status().message()));
      return 1;
    }
  }

  int received = 0;
  sigwait(&signals, &received);
  gpipe::LogInfo("gpipe-controller: %s, shutting down",
                 received == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->Shutdown(absl::Seconds(5));
  gpipe::LogInfo("gpipe-controller stopped");
  return 0;
}
