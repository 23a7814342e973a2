#include "worker/grpc_downstream_connector.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/core/bytes.h"
#include "services/core/log.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/job_spec.h"
#include "services/transport/resolve.h"
#include "services/transport/shm_segment.h"

namespace gpipe {
namespace {

// A neighbour may start (or its DNS record appear) a little late: keep
// trying for this long, in attempts short enough to notice a cancel.
constexpr absl::Duration kConnectBudget = absl::Seconds(30);
constexpr int64_t kAttemptMs = 1000;
constexpr absl::Duration kResolveRetry = absl::Milliseconds(200);

// The smallest power of two from kMinShmRingBytes that holds `need` bytes,
// at most `most`.
int64_t RingFor(double need, int64_t most) {
  int64_t ring = kMinShmRingBytes;
  while (ring < most && static_cast<double>(ring) < need) ring *= 2;
  return std::min(ring, most);
}

// `options` with rings of `ring_bytes` (and chunks that fit them).
DataPlaneOptions WithRing(DataPlaneOptions options, int64_t ring_bytes) {
  options.ring_bytes = ring_bytes;
  options.chunk_bytes = std::min(options.chunk_bytes, ring_bytes / 2);
  return options;
}

// `options` with rings of `ring` bytes, or as large as fit in
// `segment_room` (what the worker's memory for stages leaves for the
// segment this link creates), but never smaller than the smallest: frames,
// the alternative, copy each message more than once on both ends, which
// took more than a small segment would (a 256 MiB worker receiving over
// frames peaked 50 MiB higher than over shared memory). The smallest
// segment's excess over the room comes from the worker's reserve.
DataPlaneOptions FitRings(const gpipe::v1::Assignment& a,
                          const std::string& peer, int64_t ring,
                          int64_t segment_room, DataPlaneOptions options) {
  const bool offers_shm = options.mode == DataPlaneMode::kShm ||
                          options.mode == DataPlaneMode::kAuto;
  if (!offers_shm || ShmSegmentBytes(ring) <= segment_room)
    return WithRing(options, ring);
  const int64_t fitting = std::max(ShmRingFitting(segment_room, ring),
                                   std::min(ring, kMinShmRingBytes));
  LogInfo(
      "stage %d of %s: rings of %s to %s, not %s: what this worker's memory "
      "for stages leaves for the link, %s%s",
      a.stage(), a.job_id(), FormatBytes(fitting), peer, FormatBytes(ring),
      FormatBytes(segment_room),
      ShmSegmentBytes(fitting) > segment_room
          ? " (the smallest rings; the rest from its reserve)"
          : "");
  return WithRing(options, fitting);
}

}  // namespace

int64_t ShmRingBytesFor(const gpipe::v1::Assignment& a, int64_t most) {
  const absl::StatusOr<ModelShapes> shapes = InferModelShapes(a.spec().model());
  const int64_t m = std::max<int64_t>(1, a.micro_batches());
  if (!shapes.ok() || a.layer_end() < 1 ||
      a.layer_end() > static_cast<int64_t>(shapes->outputs.size())) {
    return most;  // the stage's own checks say what is wrong
  }
  const int64_t rows = (a.spec().batch_size() + m - 1) / m;
  // fp32: the widest activation dtype a boundary carries.
  const double message =
      4.0 * static_cast<double>(rows) *
      static_cast<double>(shapes->outputs[a.layer_end() - 1].numel());
  return RingFor(std::max(8 * message, 4 * m * message), most);
}

int64_t ReductionRingBytesFor(const gpipe::v1::Assignment& a, int64_t most) {
  const absl::StatusOr<ModelShapes> shapes = InferModelShapes(a.spec().model());
  if (!shapes.ok() || a.layer_begin() < 0 || a.layer_end() <= a.layer_begin() ||
      a.layer_end() > static_cast<int64_t>(shapes->costs.size())) {
    return most;
  }
  double bytes = 0;
  for (int64_t i = a.layer_begin(); i < a.layer_end(); ++i)
    bytes += static_cast<double>(shapes->costs[i].param_bytes);
  const int64_t replicas = std::max<int64_t>(1, a.replicas());
  const int64_t groups = std::max<int64_t>(
      1, (GradientGroupCount(a.spec()) + replicas - 1) / replicas);
  return RingFor(
      2 * bytes * static_cast<double>(groups) / static_cast<double>(replicas),
      most);
}

absl::StatusOr<std::unique_ptr<Link>> GrpcDownstreamConnector::Connect(
    const gpipe::v1::Assignment& a, int64_t segment_room,
    const std::function<bool()>& cancelled) {
  const std::string peer = absl::StrCat("stage ", a.stage() + 1);
  const DataPlaneOptions plane =
      FitRings(a, peer, ShmRingBytesFor(a, data_plane_.ring_bytes),
               segment_room, data_plane_);
  return Dial(a, a.downstream_address(), peer, plane, cancelled);
}

absl::StatusOr<std::unique_ptr<Link>> GrpcDownstreamConnector::ConnectReplica(
    const gpipe::v1::Assignment& a, int64_t replica, int64_t segment_room,
    const std::function<bool()>& cancelled) {
  if (replica < 0 || replica >= a.replica_addresses_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment names no address for replica ", replica,
                     " of stage ", a.stage()));
  }
  // The worker's data planes, shared memory on one host: the sum sends
  // while it receives (LinkReduction), so a bounded ring cannot block it.
  DataPlaneOptions plane = data_plane_;
  // Forcing a plane (--data_plane shm) is about the pipeline's neighbours;
  // a stage's replicas may sit on other hosts: the best that works.
  if (plane.mode != DataPlaneMode::kGrpc) plane.mode = DataPlaneMode::kAuto;
  // The sum adds host tensors (a GPU stage's go through the host): never
  // offer the CUDA IPC plane, whose links deliver device tensors.
  plane.on_gpu = false;
  const std::string peer =
      absl::StrCat("replica ", replica, " of stage ", a.stage());
  plane = FitRings(a, peer, ReductionRingBytesFor(a, plane.ring_bytes),
                   segment_room, plane);
  return Dial(a, a.replica_addresses(replica), peer, plane, cancelled);
}

absl::StatusOr<std::unique_ptr<Link>> GrpcDownstreamConnector::Dial(
    const gpipe::v1::Assignment& a, const std::string& address,
    const std::string& peer, const DataPlaneOptions& plane,
    const std::function<bool()>& cancelled) {
  // Messages in flight: every micro-batch of a step, and a few scalars.
  const size_t capacity = static_cast<size_t>(a.micro_batches()) + 4;
  ExchangeCredentials credentials = credentials_;
  credentials.stream_key = a.stream_key();
  absl::Status connected = absl::UnavailableError("not tried");
  const absl::Time start = absl::Now();
  int attempts = 0;
  while (!cancelled() && absl::Now() - start < kConnectBudget) {
    ++attempts;
    // Resolved here, each attempt, and dialled by IP (resolve.h): a name
    // connects as fast as an IP, and one that appears late is found.
    absl::StatusOr<ResolvedTarget> target =
        ResolveForDial(address, absl::Milliseconds(kAttemptMs));
    if (!target.ok()) {
      connected = target.status();
      if (!absl::IsUnavailable(connected)) return connected;
      absl::SleepFor(kResolveRetry);
      continue;
    }
    ExchangeCredentials dial = credentials;
    // The certificate names the host the neighbour advertised, not its IP.
    if (dial.channel != nullptr && dial.tls_server_name.empty()) {
      dial.tls_server_name = target->host;
    }
    absl::StatusOr<std::unique_ptr<ExchangeClientLink>> link =
        ConnectDownstream(target->target, a.job_id(), a.epoch(), a.stage(),
                          capacity, kAttemptMs, FrameCodec::kOneCopy, plane,
                          dial, a.replica());
    if (link.ok()) {
      if (attempts > 1 || !target->host.empty()) {
        LogInfo("stage %d of %s reached %s at %s (%s) in %d ms", a.stage(),
                a.job_id(), peer, address, target->ip,
                absl::ToInt64Milliseconds(absl::Now() - start));
      }
      return std::unique_ptr<Link>(std::move(*link));
    }
    connected = link.status();
    if (!target->host.empty()) {
      connected =
          absl::Status(connected.code(),
                       absl::StrCat(connected.message(), " (", address, ")"));
    }
    if (!absl::IsUnavailable(connected)) return connected;
  }
  if (cancelled()) return absl::CancelledError("cancelled");
  return connected;
}

absl::StatusOr<AgreedPlane> GrpcDownstreamConnector::AwaitDataPlane(
    Link& link, const gpipe::v1::Assignment& a,
    const std::function<bool()>& cancelled) {
  ExchangeLink& exchange = static_cast<ExchangeClientLink&>(link).link();
  for (;;) {
    absl::StatusOr<DataPlaneKind> plane =
        exchange.WaitDataPlane(std::chrono::milliseconds(250));
    if (plane.ok()) {
      const PlaneRefusal refusal = exchange.refusal();
      LogInfo(
          "stage %d of %s: data plane to stage %d is %s (--data_plane %s)%s%s",
          a.stage(), a.job_id(), a.stage() + 1, DataPlaneName(*plane),
          DataPlaneModeName(data_plane_.mode),
          *plane == DataPlaneKind::kShm
              ? absl::StrCat(", a segment of ",
                             FormatBytes(exchange.mapped_bytes()))
              : std::string(),
          refusal.empty() ? std::string()
                          : absl::StrCat(": ", refusal.ToString()));
      AgreedPlane agreed{std::string(DataPlaneName(*plane)),
                         refusal.ToString()};
      // Not offered at all: this worker's own flag said so.
      if (agreed.reason.empty() && *plane == DataPlaneKind::kGrpc &&
          data_plane_.mode == DataPlaneMode::kGrpc) {
        agreed.reason = "the sending worker runs --data_plane grpc";
      }
      return agreed;
    }
    if (!absl::IsDeadlineExceeded(plane.status())) return plane.status();
    if (cancelled()) return absl::CancelledError("cancelled");
  }
}

}  // namespace gpipe
