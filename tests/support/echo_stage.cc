#include "tests/support/echo_stage.h"

#include <chrono>
#include <thread>
#include <utility>

#include "services/transport/exchange_link.h"

namespace gpipe::test_support {

grpc::Status EchoStageService::Exchange(grpc::ServerContext* context,
                                        ExchangeServerStream* stream) {
  absl::StatusOr<gpipe::v1::Frame> open = ReadOpenFrame(stream);
  if (!open.ok()) return ToGrpcStatus(open.status());
  ExchangeLink link(std::make_unique<ServerFrameStream>(context, stream),
                    open->job_id(), open->epoch(), /*capacity=*/8);
  link.set_data_plane(planes_);
  std::thread echo([&link] {
    for (;;) {
      absl::StatusOr<Message> m = link.Receive();
      if (!m.ok()) break;
      if (m->kind == MessageKind::kActivation) m->kind = MessageKind::kGradient;
      if (!link.Send(std::move(*m)).ok()) break;
    }
    link.Release();
  });
  link.ReadLoop(/*cancel_on_reject=*/false);
  link.Close();
  echo.join();
  return ToGrpcStatus(link.read_status());
}

EchoStageServer::EchoStageServer(DataPlaneOptions planes) : service_(planes) {
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service_);
  b.SetMaxReceiveMessageSize(4 << 20);
  server_ = b.BuildAndStart();
  address_ = "127.0.0.1:" + std::to_string(port);
}

EchoStageServer::~EchoStageServer() {
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

RawUpstream::RawUpstream(const std::string& address, std::string job_id,
                         int64_t epoch)
    : job_id_(std::move(job_id)),
      epoch_(epoch),
      channel_(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
      rw_(StartExchange(channel_.get(), &context_)) {}

gpipe::v1::Frame RawUpstream::Base(gpipe::v1::FrameKind kind) const {
  gpipe::v1::Frame f;
  f.set_job_id(job_id_);
  f.set_epoch(epoch_);
  f.set_kind(kind);
  return f;
}

bool RawUpstream::Write(const gpipe::v1::Frame& f) {
  return rw_->Write(FrameToBuffer(f));
}

bool RawUpstream::Read(ReceivedFrame* frame) {
  grpc::ByteBuffer b;
  return rw_->Read(&b) && DecodeFrame(b, frame).ok();
}

grpc::Status RawUpstream::Finish() {
  rw_->WritesDone();
  grpc::ByteBuffer b;
  while (rw_->Read(&b)) {
  }
  return rw_->Finish();
}

}  // namespace gpipe::test_support
