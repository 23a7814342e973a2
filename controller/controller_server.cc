#include "controller/controller_server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "controller/unparsable_request.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "services/core/listen_probe.h"

namespace gpipe::controller {

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Start(
    const ControllerServerOptions& options) {
  std::unique_ptr<ControllerServer> server(new ControllerServer());
  server->controller_ = std::make_unique<Controller>(options.controller);
  // Jobs of the store first: workers that attach find them waiting.
  if (absl::Status recovered = server->controller_->Recover();
      !recovered.ok()) {
    return recovered;
  }
  server->service_ =
      std::make_unique<ControllerService>(*server->controller_, options.auth);

  if (absl::Status s = ProbeListen("", options.listen); !s.ok()) return s;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen,
                           options.credentials != nullptr
                               ? options.credentials
                               : grpc::InsecureServerCredentials(),
                           &server->port_);
  builder.RegisterService(server->service_.get());
  // gRPC sets SO_REUSEPORT by default: a second controller on a taken port
  // started and took every other connection (with its own job store).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(UnparsableRequestInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // Ping idle connections so that a worker whose host vanished is noticed
  // even between heartbeats, and let workers ping us as often as their
  // channels do (every 2 s: KeepaliveChannelArguments). A floor above
  // that counted each idle worker's pings as strikes and ended its stream
  // at the third ("too_many_pings") whenever heartbeats came less often.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.listen,
        " (in use by another process, or not an address of this host)"));
  }
  if (!options.health_listen.empty()) {
    absl::StatusOr<std::unique_ptr<security::HealthPort>> health =
        security::HealthPort::Start(options.health_listen);
    if (!health.ok()) return health.status();
    server->health_port_ = *std::move(health);
  }
  const std::string& listen = options.listen;
  const size_t colon = listen.rfind(':');
  server->address_ = absl::StrCat(
      colon == std::string::npos ? listen : listen.substr(0, colon), ":",
      server->port_);
  return server;
}

ControllerServer::~ControllerServer() { Shutdown(absl::Seconds(1)); }

void ControllerServer::Shutdown(absl::Duration grace) {
  if (stopped_) return;
  stopped_ = true;
  if (controller_ != nullptr) controller_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(grace));
    server_->Wait();
  }
  health_port_.reset();
}

}  // namespace gpipe::controller
