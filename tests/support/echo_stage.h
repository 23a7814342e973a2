// The two ends the link tests drive. A downstream stage: on each Exchange
// stream it runs a real ExchangeLink on the data plane it is given and sends
// every message straight back (activations as gradients, scalars in kind),
// served by a gRPC server on a free loopback port. And a hand-driven
// upstream end that writes whatever frames a test builds.
#ifndef GPIPE_TESTS_SUPPORT_ECHO_STAGE_H_
#define GPIPE_TESTS_SUPPORT_ECHO_STAGE_H_

#include <memory>
#include <string>

#include "gpipe/v1/stage.pb.h"
#include "grpcpp/grpcpp.h"
#include "services/transport/data_plane.h"
#include "services/transport/exchange_method.h"
#include "services/transport/frame_wire.h"

namespace gpipe::test_support {

class EchoStageService final : public ExchangeService {
 public:
  explicit EchoStageService(DataPlaneOptions planes) : planes_(planes) {}
  grpc::Status Exchange(grpc::ServerContext* context,
                        ExchangeServerStream* stream) override;

 private:
  DataPlaneOptions planes_;
};

class EchoStageServer {
 public:
  explicit EchoStageServer(DataPlaneOptions planes);
  ~EchoStageServer();
  const std::string& address() const { return address_; }

 private:
  EchoStageService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// One Exchange stream to `address`, written frame by frame, unchecked.
class RawUpstream {
 public:
  RawUpstream(const std::string& address, std::string job_id, int64_t epoch);
  // A frame of the stream's job and epoch.
  gpipe::v1::Frame Base(gpipe::v1::FrameKind kind) const;
  bool Write(const gpipe::v1::Frame& f);
  // The peer's next frame; false when the stream ended or it does not decode.
  bool Read(ReceivedFrame* frame);
  // Drains what the peer sends, then its final status.
  grpc::Status Finish();

 private:
  std::string job_id_;
  int64_t epoch_;
  std::shared_ptr<grpc::Channel> channel_;
  grpc::ClientContext context_;
  std::unique_ptr<ExchangeClientStream> rw_;
};

}  // namespace gpipe::test_support

#endif  // GPIPE_TESTS_SUPPORT_ECHO_STAGE_H_
