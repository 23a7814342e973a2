// The /metrics endpoint of a process on a HOST:PORT address; port 0 takes a
// free port. A small HTTP/1.0 server of our own on one thread (connections
// read side by side by poll, each within 2 s) with a normal
// stack: prometheus-cpp's civetweb exposer runs handlers on 100 KB threads,
// and the static TLS of our libraries (OpenBLAS alone takes 60 KB of it)
// left too little of that stack, so scrapes crashed workers.
#ifndef GPIPE_SERVICES_TELEMETRY_METRICS_SERVER_H_
#define GPIPE_SERVICES_TELEMETRY_METRICS_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prometheus/collectable.h"

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

  ~MetricsServer();  // stops serving and joins the thread

  int port() const { return port_; }
  // HOST:PORT with the bound port.
  const std::string& address() const { return address_; }

 private:
  MetricsServer(int fd, int port, std::string address,
                std::vector<std::weak_ptr<prometheus::Collectable>> sources);
  void Serve();
  // Answers a whole request (or one past kMaxRequestBytes with 431).
  void Answer(int connection, const std::string& request);
  std::string Exposition();

  const int fd_;  // the listening socket
  const int port_;
  const std::string address_;
  const std::vector<std::weak_ptr<prometheus::Collectable>> sources_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_METRICS_SERVER_H_
