#include "services/security/health_port.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "services/core/listen_probe.h"

namespace gpipe::security {
namespace {

// Every method but the health service's: UNIMPLEMENTED. Also what makes the
// server start at all: gRPC 1.51 adds its default health service only once
// the server starts, and refuses to build a server that has no service of
// its own yet.
class OnlyHealth final : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    class Refuse final : public grpc::ServerGenericBidiReactor {
     public:
      Refuse() {
        Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                            "this port serves only grpc.health.v1 (probes)"));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse();
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<HealthPort>> HealthPort::Start(
    const std::string& listen) {
  if (absl::Status s = ProbeListen("--health_listen: ", listen); !s.ok()) {
    return s;
  }
  std::unique_ptr<HealthPort> port(new HealthPort());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(),
                           &port->port_);
  port->unimplemented_ = std::make_unique<OnlyHealth>();
  builder.RegisterCallbackGenericService(port->unimplemented_.get());
  // Not shared with another process's probes (gRPC's SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  port->server_ = builder.BuildAndStart();
  if (port->server_ == nullptr || port->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--health_listen: cannot listen on ", listen,
                     " (in use by another process, or not an address of "
                     "this host)"));
  }
  return port;
}

HealthPort::~HealthPort() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(500));
    server_->Wait();
  }
  server_.reset();  // before the service it calls
}

}  // namespace gpipe::security
