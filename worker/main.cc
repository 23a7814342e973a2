// gpipe-worker: a stateless stage worker. It attaches to the controller,
// serves the Stage service for its upstream neighbour and runs whatever stage
// it is assigned. Kill it at any moment: nothing is lost beyond the
// assignment, which the controller reassigns.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "services/core/log.h"
#include "services/core/memory.h"
#include "services/tensor/device.h"
#include "worker/agent.h"
#include "worker/executor.h"
#include "worker/stage_service.h"

ABSL_FLAG(std::string, controller, "127.0.0.1:7070",
          "address of gpipe-controller");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "where the Stage service listens (port 0: any free port)");
ABSL_FLAG(std::string, advertise, "",
          "address neighbours use to reach this worker (default: the listen "
          "host and the bound port)");
ABSL_FLAG(int, threads, 0, "compute threads (0: all cores)");
ABSL_FLAG(std::string, device, "cpu",
          "where stages compute: cpu, cuda or auto (the GPU when present)");
ABSL_FLAG(int64_t, link_wait_ms, 10000,
          "how long an incoming link may wait for its assignment");

namespace {

std::string NewWorkerId() {
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  std::random_device rd;
  return absl::StrFormat("w-%s-%d-%04x", host, getpid(), rd() & 0xffff);
}

}  // namespace

int main(int argc, char** argv) {
  gpipe::KeepFreedMemory();
  for (int i = 1; i < argc; ++i) {  // accept --link-wait-ms as well
    if (argv[i][0] == '-' && argv[i][1] == '-')
      for (char* p = argv[i] + 2; *p && *p != '='; ++p)
        if (*p == '-') *p = '_';
  }
  absl::SetProgramUsageMessage(
      "gpipe-worker --controller HOST:PORT [--listen HOST:PORT] "
      "[--advertise HOST:PORT] [--threads T] [--device cpu|cuda|auto]");
  absl::ParseCommandLine(argc, argv);

  // Signals are taken by a dedicated thread (sigwait), not a handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const int threads =
      absl::GetFlag(FLAGS_threads) > 0
          ? absl::GetFlag(FLAGS_threads)
          : static_cast<int>(std::thread::hardware_concurrency());
  const absl::StatusOr<gpipe::Device> device =
      gpipe::ResolveDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    std::fprintf(stderr, "gpipe-worker: %s\n",
                 std::string(device.status().message()).c_str());
    return 2;
  }
  std::unique_ptr<gpipe::Agent> agent;
  gpipe::Executor executor(
      threads,
      [&agent](const gpipe::v1::WorkerMessage& m) {
        if (agent) agent->Report(m);
      },
      *device);
  gpipe::StageService service(&executor, absl::GetFlag(FLAGS_link_wait_ms));

  grpc::ServerBuilder builder;
  int port = 0;
  const std::string listen = absl::GetFlag(FLAGS_listen);
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(4 << 20);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "gpipe-worker: cannot listen on %s\n", listen.c_str());
    return 1;
  }
  std::string advertise = absl::GetFlag(FLAGS_advertise);
  if (advertise.empty()) {
    advertise = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  }
  gpipe::v1::WorkerHello hello;
  hello.set_worker_id(NewWorkerId());
  hello.set_address(advertise);
  hello.mutable_resources()->set_cpus(threads);
  hello.mutable_resources()->set_memory_bytes(
      static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE));
  gpipe::LogInfo("gpipe-worker %s serving stages on %s, controller %s",
                 hello.worker_id(), advertise, absl::GetFlag(FLAGS_controller));
  agent =
      std::make_unique<gpipe::Agent>(absl::GetFlag(FLAGS_controller), hello);

  std::thread signal_waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    gpipe::LogInfo("signal %d: shutting down", sig);
    agent->Stop();
  });
  agent->Run(&executor);
  executor.CancelAll();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  // Wake the signal thread if we got here without a signal.
  pthread_kill(signal_waiter.native_handle(), SIGTERM);
  signal_waiter.join();
  return 0;
}
