// What Kubernetes asks the worker through the standard gRPC health service
// (grpc.health.v1) on the worker's own gRPC port:
//   kLivenessService ("gpipe.v1.Stage"): SERVING while the process serves its
//     Stage service (liveness and startup probes);
//   kReadinessService (""): SERVING only while the worker is attached to the
//     controller, i.e. after the controller's Welcome and until the stream
//     breaks or the worker drains (readiness probe).
#ifndef GPIPE_WORKER_HEALTH_H_
#define GPIPE_WORKER_HEALTH_H_

#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"

namespace gpipe {

inline constexpr char kLivenessService[] = "gpipe.v1.Stage";
inline constexpr char kReadinessService[] = "";

// Call before building the server: the server then carries the health
// service with every registered service SERVING.
void EnableHealthService();

// Registers liveness as SERVING and readiness as NOT_SERVING on `server`'s
// health service, then flips readiness; liveness stays until the server
// shuts down.
// Safe from any thread; a server without a health service is left alone.
class Readiness {
 public:
  explicit Readiness(grpc::Server* server);
  void Set(bool attached);

 private:
  grpc::HealthCheckServiceInterface* health_;
};

}  // namespace gpipe

#endif  // GPIPE_WORKER_HEALTH_H_
