// A plaintext port that serves only the standard health service
// (grpc.health.v1), for Kubernetes' native gRPC probes: they cannot speak
// TLS, let alone present a client certificate, so once the main port
// requires mutual TLS the probes need a port of their own (--health_listen).
// It tells nothing but SERVING or NOT_SERVING, so being open costs nothing.
#ifndef GPIPE_SERVICES_SECURITY_HEALTH_PORT_H_
#define GPIPE_SERVICES_SECURITY_HEALTH_PORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/server.h"

namespace gpipe::security {

class HealthPort {
 public:
  // Listens on `listen` (host:port, port 0: a free one). The health service
  // answers SERVING for "" until changed through server(). UNAVAILABLE when
  // it cannot listen.
  static absl::StatusOr<std::unique_ptr<HealthPort>> Start(
      const std::string& listen);
  ~HealthPort();

  // For the health service's statuses (GetHealthCheckService()).
  grpc::Server* server() { return server_.get(); }
  int port() const { return port_; }

 private:
  HealthPort() = default;
  std::unique_ptr<grpc::CallbackGenericService> unimplemented_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace gpipe::security

#endif  // GPIPE_SERVICES_SECURITY_HEALTH_PORT_H_
