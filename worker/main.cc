// gpipe-worker: a stateless stage worker. It attaches to the controller,
// serves the Stage service for its upstream neighbour and runs whatever stage
// it is assigned. Kill it at any moment: nothing is lost beyond the
// assignment, which the controller reassigns.
//
// On SIGTERM (Kubernetes deleting the pod) it drains: readiness goes
// NOT_SERVING, it says goodbye so the controller recovers the job at once,
// abandons its step and exits 0 within --drain_timeout_ms.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/counter.h"
#include "services/core/bytes.h"
#include "services/core/cores.h"
#include "services/core/flag_spelling.h"
#include "services/core/flags_help.h"
#include "services/core/host_port.h"
#include "services/core/listen_probe.h"
#include "services/core/log.h"
#include "services/core/memory.h"
#include "services/core/status.h"
#include "services/pipeline/schedule.h"
#include "services/security/client_flags.h"
#include "services/security/client_security.h"
#include "services/security/health_port.h"
#include "services/security/stream_key.h"
#include "services/security/tls.h"
#include "services/security/tls_flags.h"
#include "services/telemetry/metrics_server.h"
#include "services/telemetry/port_file.h"
#include "services/telemetry/stage_metrics.h"
#include "services/tensor/cpu/gemm.h"
#include "services/tensor/device.h"
#include "services/tensor/threads.h"
#include "worker/agent.h"
#include "worker/controller_file_store.h"
#include "worker/executor.h"
#include "worker/health.h"
#include "worker/memory_budget.h"
#include "worker/speed_probe.h"
#include "worker/stage_service.h"

ABSL_FLAG(std::string, controller, "127.0.0.1:7070",
          "address of gpipe-controller");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "where the Stage service listens (port 0: any free port)");
ABSL_FLAG(std::string, advertise, "",
          "address neighbours use to reach this worker, e.g. the pod IP from "
          "the downward API: --advertise=$(POD_IP):7071; a HOST alone "
          "takes the bound port (default: the listen host and the bound "
          "port)");
ABSL_FLAG(int, threads, 0,
          "compute threads (0: the cores this process may use: its CPU "
          "affinity, capped by its cgroup's CPU quota)");
ABSL_FLAG(std::string, device, "cpu",
          "where stages compute: cpu, cuda or auto (the GPU when present)");
ABSL_FLAG(int64_t, link_wait_ms, 10000,
          "how long an incoming link may wait for its assignment");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT of the Prometheus /metrics endpoint (empty: off; port "
          "0: a free port, logged)");
ABSL_FLAG(std::string, metrics_port_file, "",
          "if set, the bound metrics port is written there once it serves");
ABSL_FLAG(int64_t, trace_every, 1,
          "send the stage's op timeline of every N-th step to the controller "
          "(0: never)");
ABSL_FLAG(std::string, data_plane, "auto",
          "how tensors travel to and from the neighbouring stages: auto "
          "(CUDA IPC between GPU stages on this host that can open each "
          "other's device memory, else shared memory with a stage on this "
          "host that can map it, else gRPC frames), grpc (frames only), shm "
          "(shared memory or fail) or cuda_ipc (CUDA IPC or fail; needs "
          "--device cuda)");
ABSL_FLAG(
    int64_t, shm_ring_bytes, int64_t{32} << 20,
    "shared-memory plane: the most bytes of each direction's ring per "
    "neighbouring pair (each link takes what its stage boundary's "
    "tensors need, at least 1 MiB), a multiple of 4096 (a full ring makes the "
    "sender wait); an activation or gradient of up to an eighth of it "
    "is copied once, larger ones twice");
ABSL_FLAG(int64_t, cuda_ipc_ring_bytes, int64_t{64} << 20,
          "CUDA IPC plane: bytes of device memory per direction and "
          "neighbouring pair, allocated once (a full ring makes the sender "
          "wait)");
ABSL_FLAG(std::string, memory_limit, "",
          "memory this worker may use, bytes or with a unit (8GiB); empty: "
          "the machine's memory or its cgroup's limit, whichever is smaller. "
          "Stages get it less the worker's own and a reserve (64 MiB and "
          "1/32); a stage that needs more fails as OutOfMemory before it "
          "allocates, and so does an allocation past it");
ABSL_FLAG(double, compute_slowdown, 1.0,
          "for tests and benchmarks: every layer of a CPU stage takes this "
          "many times as long (>= 1; the rest is slept, the CPU left free), "
          "so one process stands for a slower machine");
ABSL_FLAG(int64_t, parked_state_seconds, 120,
          "how long a stage's state kept for a resume from memory (after a "
          "replica of its job was lost) waits for the assignment that uses "
          "it before it is freed (the controller decides within seconds "
          "and restarts after at most 30 s of backoff)");
ABSL_FLAG(int64_t, drain_timeout_ms, 10000,
          "on SIGTERM, the longest the worker takes to say goodbye, abandon "
          "its step and exit");

// Security (docs/security.md): without these, plaintext and no token.
// --tls_cert, --tls_key, --tls_ca (services/security/tls_flags.h) and
// --token_file (services/security/client_flags.h) are shared with gpipectl.
ABSL_FLAG(std::string, tls_peer_name, "",
          "the name expected in other workers' certificates, which are "
          "dialled by IP (e.g. gpipe-worker); empty: the address's host");
ABSL_FLAG(std::string, health_listen, "",
          "HOST:PORT of a plaintext port serving only grpc.health.v1 (same "
          "liveness and readiness as the Stage port), for probes that cannot "
          "speak TLS (empty: off)");

namespace {

// The worker's TLS and token from the flags.
struct WorkerSecurity {
  std::optional<gpipe::security::TlsMaterial> server_tls;
  gpipe::security::ClientSecurity attach;  // to the controller
  gpipe::ExchangeCredentials exchange;     // to the downstream stage
};

absl::StatusOr<WorkerSecurity> LoadSecurity() {
  WorkerSecurity security;
  ASSIGN_OR_RETURN(security.server_tls, gpipe::security::ServerTlsFromFlags());
  ASSIGN_OR_RETURN(security.attach,
                   gpipe::security::ClientSecurityFromFlags(nullptr));
  if (security.attach.secure()) {
    security.exchange.channel = security.attach.Credentials();
    security.exchange.tls_server_name = absl::GetFlag(FLAGS_tls_peer_name);
  }
  return security;
}

// Written once before any handler can run; the handler only writes to it
// (write(2) is async-signal-safe).
int signal_pipe[2] = {-1, -1};

extern "C" void OnSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  (void)!write(signal_pipe[1], &byte, 1);
}

std::string NewWorkerId() {
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  return absl::StrFormat("w-%s-%d-%04x", host, getpid(), rd() & 0xffff);
}

}  // namespace

int main(int argc, char** argv) {
  gpipe::KeepFreedMemory();
  gpipe::ExplainOutOfMemory();
  gpipe::SpellFlagsForAbsl(argc, argv);  // --link-wait-ms as well
  gpipe::ListProjectFlagsInHelp(argv[0]);
  absl::SetProgramUsageMessage(
      "gpipe-worker --controller HOST:PORT [--listen HOST:PORT] "
      "[--advertise HOST:PORT] [--threads T] [--device cpu|cuda|auto] "
      "[--metrics_listen HOST:PORT] [--trace_every N] [--drain_timeout_ms N] "
      "[--tls_cert F --tls_key F --tls_ca F] [--tls_peer_name NAME] "
      "[--token_file F] [--health_listen HOST:PORT] "
      "[--data_plane auto|grpc|shm|cuda_ipc] [--shm_ring_bytes N] "
      "[--cuda_ipc_ring_bytes N] [--compute_slowdown F]\n"
      "On Kubernetes: --listen=0.0.0.0:7071 --advertise=$(POD_IP):7071");
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (absl::Status s = gpipe::CheckNoArguments("gpipe-worker", rest); !s.ok()) {
    std::fprintf(stderr, "gpipe-worker: %s\n",
                 std::string(s.message()).c_str());
    return 2;
  }
  if (const int threads = absl::GetFlag(FLAGS_threads);
      threads < 0 || threads > gpipe::kMaxThreads) {
    std::fprintf(stderr,
                 "gpipe-worker: --threads must be between 0 (the usable "
                 "cores) and %d, got %d\n",
                 gpipe::kMaxThreads, threads);
    return 2;
  }
  if (absl::GetFlag(FLAGS_link_wait_ms) <= 0) {
    std::fprintf(stderr, "gpipe-worker: --link_wait_ms must be positive\n");
    return 2;
  }
  for (const auto& [flag, address] :
       {std::pair<const char*, std::string>{"--listen",
                                            absl::GetFlag(FLAGS_listen)},
        {"--controller", absl::GetFlag(FLAGS_controller)},
        {"--advertise", absl::GetFlag(FLAGS_advertise)}}) {
    if (absl::Status s = gpipe::CheckPortInRange(flag, address); !s.ok()) {
      std::fprintf(stderr, "gpipe-worker: %s\n",
                   std::string(s.message()).c_str());
      return 2;
    }
  }
  const double slowdown = absl::GetFlag(FLAGS_compute_slowdown);
  if (!(slowdown >= 1.0 && slowdown <= 1000.0)) {
    std::fprintf(stderr,
                 "gpipe-worker: --compute_slowdown must be in [1, 1000]\n");
    return 2;
  }
  const int64_t drain_ms = absl::GetFlag(FLAGS_drain_timeout_ms);
  if (drain_ms <= 0) {
    std::fprintf(stderr, "gpipe-worker: --drain_timeout_ms must be positive\n");
    return 2;
  }

  absl::StatusOr<WorkerSecurity> security = LoadSecurity();
  if (!security.ok()) {
    std::fprintf(stderr, "gpipe-worker: %s\n",
                 std::string(security.status().message()).c_str());
    return 2;
  }
  const std::string health_listen = absl::GetFlag(FLAGS_health_listen);
  if (!health_listen.empty()) {
    if (absl::Status s =
            gpipe::CheckListenAddress("health_listen", health_listen);
        !s.ok()) {
      std::fprintf(stderr, "gpipe-worker: %s\n",
                   std::string(s.message()).c_str());
      return 2;
    }
  }

  // SIGTERM and SIGINT reach a waiting thread through a pipe. Blocking them
  // for sigwait is not enough here: OpenBLAS starts its threads before
  // main(), with the signals unblocked, and the default action on one of
  // them would kill the process mid-drain.
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) {
    std::perror("gpipe-worker: pipe");
    return 1;
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);

  // Metrics first: a bad address is refused before anything attaches.
  prometheus::Registry registry;
  auto metrics = std::make_shared<gpipe::PipelineMetrics>(registry);
  std::unique_ptr<gpipe::MetricsServer> metrics_server;
  if (const std::string m = absl::GetFlag(FLAGS_metrics_listen); !m.empty()) {
    absl::StatusOr<std::unique_ptr<gpipe::MetricsServer>> started =
        gpipe::MetricsServer::Start(m, {metrics});
    if (!started.ok()) {
      std::fprintf(stderr, "gpipe-worker: %s\n",
                   std::string(started.status().message()).c_str());
      return absl::IsInvalidArgument(started.status()) ? 2 : 1;
    }
    metrics_server = *std::move(started);
    gpipe::LogInfo("gpipe-worker metrics on http://%s/metrics",
                   metrics_server->address());
    if (const std::string f = absl::GetFlag(FLAGS_metrics_port_file);
        !f.empty()) {
      if (absl::Status s = gpipe::WritePortFile(f, metrics_server->port());
          !s.ok()) {
        std::fprintf(stderr, "gpipe-worker: %s\n",
                     std::string(s.message()).c_str());
        return 1;
      }
    }
  }

  const int threads = absl::GetFlag(FLAGS_threads) > 0
                          ? absl::GetFlag(FLAGS_threads)
                          : gpipe::AvailableCores();
  const absl::StatusOr<gpipe::Device> device =
      gpipe::ResolveDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    std::fprintf(stderr, "gpipe-worker: %s\n",
                 std::string(device.status().message()).c_str());
    return 2;
  }
  if (*device == gpipe::Device::kCuda) {
    gpipe::LogInfo("gpipe-worker computes on %s",
                   gpipe::CudaDescription().c_str());
  }
  std::unique_ptr<gpipe::Agent> agent;
  gpipe::Executor executor(
      threads,
      [&agent](const gpipe::v1::WorkerMessage& m) {
        if (agent) agent->Report(m);
      },
      metrics_server != nullptr ? metrics.get() : nullptr, *device);
  if (absl::GetFlag(FLAGS_trace_every) < 0) {
    std::fprintf(stderr, "gpipe-worker: --trace_every must be 0 or more\n");
    return 2;
  }
  executor.set_trace_every(absl::GetFlag(FLAGS_trace_every));
  const absl::StatusOr<gpipe::MemoryBudget> memory = gpipe::ComputeMemoryBudget(
      absl::GetFlag(FLAGS_memory_limit), gpipe::SystemMemoryLimit(),
      gpipe::ResidentBytes());
  if (!memory.ok()) {
    std::fprintf(stderr, "gpipe-worker: %s\n",
                 std::string(memory.status().message()).c_str());
    return 2;
  }
  executor.set_memory_budget(memory->stages);
  // The heap keeps freed memory (KeepFreedMemory), and with it what it
  // cannot reuse: near the limit it hands that back before it grows.
  gpipe::SetResidentCeiling(memory->limit);
  if (absl::GetFlag(FLAGS_parked_state_seconds) < 1) {
    std::fprintf(stderr,
                 "gpipe-worker: --parked_state_seconds must be 1 or more\n");
    return 2;
  }
  executor.set_parked_state_ttl(
      std::chrono::seconds(absl::GetFlag(FLAGS_parked_state_seconds)));
  executor.set_exchange_credentials(security->exchange);
  executor.set_compute_slowdown(slowdown);
  {
    const absl::StatusOr<gpipe::DataPlaneMode> mode =
        gpipe::ParseDataPlaneMode(absl::GetFlag(FLAGS_data_plane));
    gpipe::DataPlaneOptions planes;
    if (mode.ok()) planes.mode = *mode;
    planes.ring_bytes = absl::GetFlag(FLAGS_shm_ring_bytes);
    // A tensor of one chunk is received in place (one copy), and the
    // channel allows chunks of up to an eighth of the ring: a larger ring is
    // how large activations get the one-copy path.
    planes.chunk_bytes = planes.ring_bytes / 8;
    planes.on_gpu = *device == gpipe::Device::kCuda;
    planes.cuda_ipc_ring_bytes = absl::GetFlag(FLAGS_cuda_ipc_ring_bytes);
    absl::Status valid =
        mode.ok() ? gpipe::ValidateDataPlaneOptions(planes) : mode.status();
    if (valid.ok() && planes.mode == gpipe::DataPlaneMode::kCudaIpc &&
        !planes.on_gpu) {
      valid = absl::InvalidArgumentError(
          "--data_plane cuda_ipc needs the stages on the GPU (--device cuda)");
    }
    if (!valid.ok()) {
      std::fprintf(stderr, "gpipe-worker: %s\n",
                   std::string(valid.message()).c_str());
      return 2;
    }
    executor.set_data_plane(planes);
  }
  {
    // Checkpoints and final parameters go to the controller on a channel of
    // their own, so a large upload never delays the Attach stream's
    // heartbeats.
    grpc::ChannelArguments args;
    security->attach.ApplyTo(args);
    // A restarted controller is reached within 2 s, not after gRPC's
    // default backoff of up to two minutes: the restore it assigns waits.
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    executor.set_controller_file_store(
        std::make_unique<gpipe::ControllerFileStore>(
            grpc::CreateCustomChannel(absl::GetFlag(FLAGS_controller),
                                      security->attach.Credentials(), args),
            security->attach));
  }
  gpipe::StageService service(&executor, absl::GetFlag(FLAGS_link_wait_ms));
  // Refused Exchange streams by reason: "stream_key" (no or a wrong key:
  // someone not assigned tried to push frames), "fenced" (another job or
  // epoch, a duplicate link), "other".
  auto& rejected = prometheus::BuildCounter()
                       .Name("gpipe_stage_rejected_streams_total")
                       .Help("Exchange streams this worker refused, by reason")
                       .Register(registry);
  // Each reason's series from the start, at 0: a family with no series is
  // absent from /metrics, so a rate() or an alert on it had no data until
  // the first refusal.
  for (const char* reason : {"stream_key", "fenced", "other"})
    rejected.Add({{"reason", reason}});
  service.set_on_rejected([&rejected](const absl::Status& s) {
    const char* reason =
        absl::IsPermissionDenied(s) ? "stream_key"
        : absl::IsFailedPrecondition(s) || absl::IsAlreadyExists(s) ? "fenced"
                                                                    : "other";
    rejected.Add({{"reason", reason}}).Increment();
  });

  gpipe::EnableHealthService();
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  if (absl::Status s = gpipe::ProbeListen("", listen); !s.ok()) {
    std::fprintf(stderr, "gpipe-worker: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  }
  builder.AddListeningPort(
      listen, gpipe::security::MakeServerCredentials(security->server_tls),
      &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(4 << 20);
  // A taken port is an error, not shared with another worker's stages
  // (gRPC sets SO_REUSEPORT by default).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr,
                 "gpipe-worker: cannot listen on %s (in use by another "
                 "process, or not an address of this host)\n",
                 listen.c_str());
    return 1;
  }
  gpipe::Readiness readiness(server.get());
  // Probes that cannot speak TLS ask a plaintext port the same questions.
  std::unique_ptr<gpipe::security::HealthPort> health_port;
  std::optional<gpipe::Readiness> probe_readiness;
  if (!health_listen.empty()) {
    absl::StatusOr<std::unique_ptr<gpipe::security::HealthPort>> started =
        gpipe::security::HealthPort::Start(health_listen);
    if (!started.ok()) {
      std::fprintf(stderr, "gpipe-worker: %s\n",
                   std::string(started.status().message()).c_str());
      return 1;
    }
    health_port = *std::move(started);
    probe_readiness.emplace(health_port->server());
    gpipe::LogInfo("gpipe-worker plaintext health on port %d",
                   health_port->port());
  }
  const auto set_ready = [&readiness, &probe_readiness](bool attached) {
    readiness.Set(attached);
    if (probe_readiness) probe_readiness->Set(attached);
  };
  std::string advertise = absl::GetFlag(FLAGS_advertise);
  if (absl::StrContains(advertise, "$(")) {
    // Kubernetes expands $(VAR) in args only for variables the container
    // declares; anything else (or a runtime without the expansion) passes
    // the text through, and neighbours would dial it.
    std::fprintf(stderr,
                 "gpipe-worker: --advertise=%s holds an unexpanded "
                 "variable: declare it in the container's env (the "
                 "downward API's status.podIP) or pass the address\n",
                 advertise.c_str());
    return 2;
  }
  if (advertise.empty()) {
    advertise = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  } else if (!absl::StrContains(advertise, ':')) {
    // A host name alone (a pod's name from the downward API, say).
    advertise = absl::StrCat(advertise, ":", port);
  }
  gpipe::v1::WorkerHello hello;
  hello.set_worker_id(NewWorkerId());
  {
    // Proves a re-attach is this process (WorkerHello.session_key).
    absl::StatusOr<std::string> key = gpipe::security::NewStreamKey();
    if (!key.ok()) {
      std::fprintf(stderr, "gpipe-worker: %s\n",
                   std::string(key.status().message()).c_str());
      return 1;
    }
    hello.set_session_key(*key);
  }
  hello.set_address(advertise);
  hello.add_capabilities(std::string(gpipe::kChunksCapability));
  hello.add_capabilities(std::string(gpipe::kZeroBubbleVCapability));
  hello.mutable_resources()->set_cpus(threads);
  hello.mutable_resources()->set_memory_bytes(memory->stages);
  if (*device == gpipe::Device::kCpu) {
    gpipe::SetComputeThreads(threads);
    absl::StatusOr<double> gflops = gpipe::ProbeComputeSpeed(slowdown);
    if (gflops.ok()) {
      hello.mutable_resources()->set_probe_gflops(*gflops);
      gpipe::LogInfo("gpipe-worker speed probe: %.1f GFLOP/s on %d threads",
                     *gflops, threads);
    } else {
      gpipe::LogWarning("gpipe-worker speed probe: %s",
                        std::string(gflops.status().message()).c_str());
    }
  }
  gpipe::LogInfo(
      "gpipe-worker memory: %s for stages (limit %s from %s, %s "
      "in use, %s kept for buffers)",
      gpipe::FormatBytes(memory->stages), gpipe::FormatBytes(memory->limit),
      memory->source, gpipe::FormatBytes(memory->resident),
      gpipe::FormatBytes(memory->reserve));
  gpipe::LogInfo("gpipe-worker %s serving stages on %s, controller %s",
                 hello.worker_id(), advertise, absl::GetFlag(FLAGS_controller));
  // Spinning compute threads on shared cores slowed trainings 3x
  // (bench/shared_cores_bench.sh): say which way this worker waits.
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  // The GEMM tile says how fast this CPU's stages are, not what they
  // compute: every tile gives the same bits (services/tensor/cpu/gemm.h).
  gpipe::LogInfo(
      "gpipe-worker compute: %d threads, OMP_WAIT_POLICY=%s, GEMM tile %s",
      threads,
      wait_policy != nullptr ? wait_policy : "(default: spin, then sleep)",
      gpipe::cpu::GemmKernelName());
  agent = std::make_unique<gpipe::Agent>(absl::GetFlag(FLAGS_controller), hello,
                                         set_ready, security->attach);

  std::atomic<bool> signalled{false};
  std::atomic<bool> exiting{false};
  std::thread signal_waiter([&] {
    unsigned char byte = 0;
    while (read(signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {
    }
    const int sig = byte;
    if (exiting || sig == 0) return;
    signalled = true;
    gpipe::LogInfo("%s: draining (at most %d ms)",
                   sig == SIGTERM ? "SIGTERM" : "SIGINT", drain_ms);
    set_ready(false);
    // A step that will not stop must not keep the pod past its grace.
    std::thread([drain_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(drain_ms));
      gpipe::LogError("gpipe-worker: the drain took longer than %d ms; exiting",
                      drain_ms);
      std::_Exit(1);
    }).detach();
    agent->Leave(
        sig == SIGTERM ? "SIGTERM" : "SIGINT",
        std::chrono::milliseconds(std::min<int64_t>(drain_ms / 2, 3000)));
  });
  agent->Run(&executor);
  executor.CancelAll();  // abandons the step; the controller replays it
  const auto grace = std::chrono::milliseconds(
      signalled ? std::min<int64_t>(2000, drain_ms / 4) : 2000);
  server->Shutdown(std::chrono::system_clock::now() + grace);
  // Wake the signal thread if we got here without a signal.
  exiting = true;
  if (!signalled) {
    const unsigned char wake = 0;
    (void)!write(signal_pipe[1], &wake, 1);
  }
  signal_waiter.join();
  gpipe::LogInfo("gpipe-worker stopped");
  return 0;
}
