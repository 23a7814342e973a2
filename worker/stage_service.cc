#include "worker/stage_service.h"

#include "services/core/log.h"

namespace gpipe {

grpc::Status StageService::Exchange(grpc::ServerContext* context,
                                    ExchangeServerStream* stream) {
  absl::StatusOr<gpipe::v1::Frame> open = ReadOpenFrame(stream);
  if (!open.ok()) return ToGrpc(open.status());
  auto link = std::make_shared<ExchangeLink>(
      std::make_unique<ServerFrameStream>(context, stream), open->job_id(),
      open->epoch(), /*capacity=*/64);
  // The stream key is checked with the assignment (the stage's epoch may
  // still be on its way); a missing one is presented as empty.
  std::string stream_key;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find(kStreamKeyMetadata); it != metadata.end()) {
    stream_key.assign(it->second.data(), it->second.size());
  }
  link->set_data_plane(executor_->data_plane());
  absl::Status accepted = executor_->AcceptUpstream(
      open->job_id(), open->epoch(), open->from_stage(), open->from_replica(),
      link, link_wait_ms_, std::move(stream_key));
  if (!accepted.ok()) {
    // The peer and the reason, never the key.
    LogWarning("rejected a link from %s: %s", context->peer(),
               std::string(accepted.message()));
    if (on_rejected_) on_rejected_(accepted);
    return ToGrpc(accepted);
  }
  link->ReadLoop(/*cancel_on_reject=*/false);
  // The stream object lives until this handler returns, so wait until the
  // stage has stopped writing to it.
  link->WaitReleased();
  return ToGrpc(link->read_status());
}

}  // namespace gpipe
