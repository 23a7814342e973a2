#include "tests/support/echo_stage.h"

#include <chrono>
#include <thread>
#include <utility>

#include "services/transport/grpc_link.h"

namespace gpipe::test_support {

grpc::Status EchoStageService::Exchange(grpc::ServerContext* context,
                                        ExchangeServerStream* stream) {
  absl::StatusOr<gpipe::v1::Frame> open = ReadOpenFrame(stream);
  if (!open.ok()) return ToGrpcStatus(open.status());
  GrpcLink link(std::make_unique<ServerFrameStream>(context, stream),
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

}  // namespace gpipe::test_support
