#include "worker/stage_service.h"

#include "services/core/log.h"

namespace gpipe {
namespace {

using gpipe::v1::Frame;

class ServerFrameStream final : public FrameStream {
 public:
  ServerFrameStream(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<Frame, Frame>* stream)
      : context_(context), stream_(stream) {}
  bool Read(Frame* f) override { return stream_->Read(f); }
  bool Write(const Frame& f) override { return stream_->Write(f); }
  void Cancel() override { context_->TryCancel(); }

 private:
  grpc::ServerContext* context_;
  grpc::ServerReaderWriter<Frame, Frame>* stream_;
};

}  // namespace

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

grpc::Status StageService::Exchange(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<Frame, Frame>* stream) {
  Frame open;
  if (!stream->Read(&open)) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "the stream ended before its first frame");
  }
  if (open.kind() != gpipe::v1::OPEN) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first frame of an Exchange must be OPEN");
  }
  auto link = std::make_shared<GrpcLink>(
      std::make_unique<ServerFrameStream>(context, stream), open.job_id(),
      open.epoch(), /*capacity=*/64);
  absl::Status accepted = executor_->AcceptUpstream(
      open.job_id(), open.epoch(), open.from_stage(), link, link_wait_ms_);
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
