// The worker's DownstreamConnector: an Exchange stream to the next stage's
// worker (TLS and the assignment's stream key when set), offering the data
// planes --data_plane allows.
#ifndef GPIPE_WORKER_GRPC_DOWNSTREAM_CONNECTOR_H_
#define GPIPE_WORKER_GRPC_DOWNSTREAM_CONNECTOR_H_

#include "services/transport/data_plane.h"
#include "services/transport/exchange_link.h"
#include "worker/downstream_connector.h"

namespace gpipe {

class GrpcDownstreamConnector final : public DownstreamConnector {
 public:
  GrpcDownstreamConnector(ExchangeCredentials credentials,
                          DataPlaneOptions data_plane)
      : credentials_(std::move(credentials)), data_plane_(data_plane) {}

  // For up to 30 s, in attempts of a second each, so that a cancel (the job
  // restarted: the peer may be dead) is noticed at once. Each attempt
  // resolves the neighbour's name anew (resolve.h) and dials its IP.
  absl::StatusOr<std::unique_ptr<Link>> Connect(
      const gpipe::v1::Assignment& a, int64_t segment_room,
      const std::function<bool()>& cancelled) override;
  // The worker's planes but CUDA IPC (the sum adds host tensors), shared
  // memory where the replica shares this host: the sum sends while it
  // receives (LinkReduction), so a bounded ring cannot block it.
  absl::StatusOr<std::unique_ptr<Link>> ConnectReplica(
      const gpipe::v1::Assignment& a, int64_t replica, int64_t segment_room,
      const std::function<bool()>& cancelled) override;
  // The next stage's answer to the offer, in short waits so that a cancel
  // is noticed; logged with why a faster plane was refused.
  absl::StatusOr<AgreedPlane> AwaitDataPlane(
      Link& link, const gpipe::v1::Assignment& a,
      const std::function<bool()>& cancelled) override;

 private:
  // Dials `address` (`peer` in messages: "stage 3", "replica 1 of stage
  // 3") as (a.stage(), a.replica()), offering `plane`.
  absl::StatusOr<std::unique_ptr<Link>> Dial(
      const gpipe::v1::Assignment& a, const std::string& address,
      const std::string& peer, const DataPlaneOptions& plane,
      const std::function<bool()>& cancelled);

  const ExchangeCredentials credentials_;
  const DataPlaneOptions data_plane_;
};

// The shared-memory ring per direction for the link from `a`'s stage to the
// next: room for every micro-batch of a step in flight, each one chunk that
// the receiver may hold in place (a chunk is at most an eighth of the ring,
// the receiver holds at most a quarter), as a power of two within
// [kMinShmRingBytes, `most`] (`most` itself when the model's shapes do not
// say). A small model's link then maps and pre-faults a megabyte, not
// `most`: what a stage's start, and so a recovery, waits for.
int64_t ShmRingBytesFor(const gpipe::v1::Assignment& a, int64_t most);

// The same for a link between the replicas of `a`'s stage: room for two of
// the largest messages of its gradient sum (each replica's share of the
// stage's gradients, for every group it runs). The sum sends while it
// receives, so a smaller ring only costs speed, never a deadlock.
int64_t ReductionRingBytesFor(const gpipe::v1::Assignment& a, int64_t most);

}  // namespace gpipe

#endif  // GPIPE_WORKER_GRPC_DOWNSTREAM_CONNECTOR_H_
