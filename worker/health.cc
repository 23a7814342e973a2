#include "worker/health.h"

namespace gpipe {

void EnableHealthService() { grpc::EnableDefaultHealthCheckService(true); }

Readiness::Readiness(grpc::Server* server)
    : health_(server->GetHealthCheckService()) {
  // The default service knows only "" until told other names.
  if (health_ != nullptr) health_->SetServingStatus(kLivenessService, true);
  // Not ready until the controller has welcomed us.
  Set(false);
}

void Readiness::Set(bool attached) {
  if (health_ != nullptr)
    health_->SetServingStatus(kReadinessService, attached);
}

}  // namespace gpipe
