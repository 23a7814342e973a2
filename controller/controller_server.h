// A running controller: the Controller, its gRPC service, the standard
// health service and server reflection, with keepalive so that dead peers
// are noticed. gpipe-controller's main and the tests both start one.
#ifndef GPIPE_CONTROLLER_CONTROLLER_SERVER_H_
#define GPIPE_CONTROLLER_CONTROLLER_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "controller/controller.h"
#include "controller/controller_service.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "services/security/health_port.h"

namespace gpipe::controller {

struct ControllerServerOptions {
  std::string listen = "127.0.0.1:7070";  // port 0 picks a free one
  ControllerOptions controller;
  // TLS (services/security/tls.h); null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Bearer tokens for the job API and for Attach; none: open.
  ServiceAuth auth;
  // If set, a plaintext port that serves only grpc.health.v1, for probes
  // that cannot speak TLS (services/security/health_port.h).
  std::string health_listen;
};

class ControllerServer {
 public:
  // Unavailable when it cannot listen on options.listen.
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Start(
      const ControllerServerOptions& options);
  ~ControllerServer();  // Shutdown(absl::Seconds(1))

  int port() const { return port_; }
  // options.listen with the bound port: "127.0.0.1:40123".
  const std::string& address() const { return address_; }
  // The plaintext health port; 0 without options.health_listen.
  int health_port() const {
    return health_port_ != nullptr ? health_port_->port() : 0;
  }
  Controller& controller() { return *controller_; }

  // Ends every Attach and WatchJob stream, then stops the server, cancelling
  // what is still running after `grace`. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  ControllerServer() = default;

  std::unique_ptr<Controller> controller_;
  std::unique_ptr<ControllerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<security::HealthPort> health_port_;
  int port_ = 0;
  std::string address_;
  bool stopped_ = false;
};

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_CONTROLLER_SERVER_H_
