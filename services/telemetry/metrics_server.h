// The /metrics endpoint of a process (prometheus-cpp's pull exposer) on a
// HOST:PORT address; port 0 takes a free port.
#ifndef GPIPE_SERVICES_TELEMETRY_METRICS_SERVER_H_
#define GPIPE_SERVICES_TELEMETRY_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace gpipe {

// OK for "HOST:PORT" with a port in [0, 65535]; InvalidArgument naming
// `flag` and what is wrong otherwise.
absl::Status CheckListenAddress(const std::string& flag,
                                const std::string& address);

class MetricsServer {
 public:
  // Serves `collectables` (kept as weak references: the caller keeps them
  // alive) at http://ADDRESS/metrics. InvalidArgument for a malformed
  // address, Unavailable when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address,
      const std::vector<std::shared_ptr<prometheus::Collectable>>&
          collectables);

  int port() const { return port_; }
  // HOST:PORT with the bound port.
  const std::string& address() const { return address_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, int port,
                std::string address)
      : exposer_(std::move(exposer)),
        port_(port),
        address_(std::move(address)) {}

  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
  std::string address_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_METRICS_SERVER_H_
