#include "worker/stage_service.h"

#include "services/core/log.h"

namespace gpipe {

grpc::Status StageService::Exchange(grpc::ServerContext* context,
                                    ExchangeServerStream* stream) {
  absl::StatusOr<gpipe::v1::Frame> open = ReadOpenFrame(stream);
  if (!open.ok()) return ToGrpc(open.status());
  auto link = std::make_shared<GrpcLink>(
      std::make_unique<ServerFrameStream>(context, stream), open->job_id(),
      open->epoch(), /*capacity=*/64);
  link->set_data_plane(executor_->data_plane());
  absl::Status accepted = executor_->AcceptUpstream(
      open->job_id(), open->epoch(), open->from_stage(), link, link_wait_ms_);
  if (!accepted.ok()) {
    LogWarning("rejected a link: %s", std::string(accepted.message()));
    return ToGrpc(accepted);
  }
  link->ReadLoop(/*cancel_on_reject=*/false);
  // The stream object lives until this handler returns, so wait until the
  // stage has stopped writing to it.
  link->WaitReleased();
  return ToGrpc(link->read_status());
}

}  // namespace gpipe
