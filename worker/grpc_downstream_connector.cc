#include "worker/grpc_downstream_connector.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "services/core/log.h"

namespace gpipe {
namespace {

constexpr int kConnectAttempts = 30;
constexpr int64_t kAttemptMs = 1000;

}  // namespace

absl::StatusOr<std::unique_ptr<Link>> GrpcDownstreamConnector::Connect(
    const gpipe::v1::Assignment& a, const std::function<bool()>& cancelled) {
  // Messages in flight: every micro-batch of a step, and a few scalars.
  const size_t capacity = static_cast<size_t>(a.micro_batches()) + 4;
  ExchangeCredentials credentials = credentials_;
  credentials.stream_key = a.stream_key();
  absl::Status connected = absl::UnavailableError("not tried");
  for (int attempt = 0; attempt < kConnectAttempts && !cancelled(); ++attempt) {
    absl::StatusOr<std::unique_ptr<ExchangeClientLink>> link =
        ConnectDownstream(a.downstream_address(), a.job_id(), a.epoch(),
                          a.stage(), capacity, kAttemptMs, FrameCodec::kOneCopy,
                          data_plane_, credentials);
    if (link.ok()) return std::unique_ptr<Link>(std::move(*link));
    connected = link.status();
    if (!absl::IsUnavailable(connected)) return connected;
  }
  if (cancelled()) return absl::CancelledError("cancelled");
  return connected;
}

absl::StatusOr<std::string> GrpcDownstreamConnector::AwaitDataPlane(
    Link& link, const gpipe::v1::Assignment& a,
    const std::function<bool()>& cancelled) {
  ExchangeLink& exchange = static_cast<ExchangeClientLink&>(link).link();
  for (;;) {
    absl::StatusOr<DataPlaneKind> plane =
        exchange.WaitDataPlane(std::chrono::milliseconds(250));
    if (plane.ok()) {
      const PlaneRefusal refusal = exchange.refusal();
      LogInfo(
          "stage %d of %s: data plane to stage %d is %s (--data_plane %s)%s",
          a.stage(), a.job_id(), a.stage() + 1, DataPlaneName(*plane),
          DataPlaneModeName(data_plane_.mode),
          refusal.empty() ? std::string()
                          : absl::StrCat(": ", refusal.ToString()));
      return std::string(DataPlaneName(*plane));
    }
    if (!absl::IsDeadlineExceeded(plane.status())) return plane.status();
    if (cancelled()) return absl::CancelledError("cancelled");
  }
}

}  // namespace gpipe
