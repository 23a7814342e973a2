#include "services/telemetry/metrics_server.h"

#include <exception>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gpipe {

absl::Status CheckListenAddress(const std::string& flag,
                                const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", address,
                     "' is not HOST:PORT (e.g. 127.0.0.1:9464)"));
  }
  int port = -1;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", address.substr(colon + 1),
                     "' is not a port number in 0..65535"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address,
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  if (absl::Status s = CheckListenAddress("metrics_listen", address); !s.ok())
    return s;
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // civetweb throws when it cannot bind; nothing crosses this boundary.
    exposer = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ",
                                               address, ": ", e.what(),
                                               " (is the port in use?)"));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics server on ", address, " reports no port"));
  }
  for (const auto& c : collectables) exposer->RegisterCollectable(c);
  const std::string bound =
      absl::StrCat(address.substr(0, address.rfind(':')), ":", ports[0]);
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(exposer), ports[0], bound));
}

}  // namespace gpipe
