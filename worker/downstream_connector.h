// How a stage reaches the next stage. The worker dials it over gRPC
// (grpc_downstream_connector.h); a unit test joins executors in one process
// with in-process links, so the executor is tested without a network.
#ifndef GPIPE_WORKER_DOWNSTREAM_CONNECTOR_H_
#define GPIPE_WORKER_DOWNSTREAM_CONNECTOR_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpipe/v1/controller.pb.h"
#include "services/transport/link.h"

namespace gpipe {

// A link's data plane as agreed with the peer: its name ("cuda_ipc", "shm",
// "grpc", "in_process"), and why not a faster one ("no shared memory: the
// offer is from another host"; empty when nothing faster was possible).
struct AgreedPlane {
  std::string name;
  std::string reason;
};

class DownstreamConnector {
 public:
  virtual ~DownstreamConnector() = default;

  // Opens the link to stage a.stage() + 1 of `a`, retrying while the peer
  // is not up yet; CANCELLED as soon as `cancelled()` says so.
  // `segment_room`: the host memory the link's data plane may map (its
  // shared-memory segment), what the worker's memory for stages leaves for
  // it; INT64_MAX where nothing bounds it.
  virtual absl::StatusOr<std::unique_ptr<Link>> Connect(
      const gpipe::v1::Assignment& a, int64_t segment_room,
      const std::function<bool()>& cancelled) = 0;

  // Opens a gradient reduction link to the worker that runs stage
  // a.stage() in replica `replica` (a.replica_addresses(replica)), as
  // replica a.replica() of it; retries, cancels and fits its segment in
  // `segment_room` as Connect does.
  virtual absl::StatusOr<std::unique_ptr<Link>> ConnectReplica(
      const gpipe::v1::Assignment& a, int64_t replica, int64_t segment_room,
      const std::function<bool()>& cancelled) = 0;

  // Waits until the data plane of `link` (as Connect returned it) is agreed
  // with the peer, for progress reports and metrics.
  virtual absl::StatusOr<AgreedPlane> AwaitDataPlane(
      Link& link, const gpipe::v1::Assignment& a,
      const std::function<bool()>& cancelled) = 0;
};

}  // namespace gpipe

#endif  // GPIPE_WORKER_DOWNSTREAM_CONNECTOR_H_
