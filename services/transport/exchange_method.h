// The Stage service's Exchange method with raw byte buffers as messages, so
// frames are encoded and decoded by frame_wire.h instead of protobuf's
// generated (copying) serializers. The bytes on the wire are those of
// gpipe.v1.Frame: peers built from stage.proto interoperate.
//
// Why grpc::internal: gRPC 1.51's public API offers byte-buffer streams only
// as generic async (CompletionQueue) or callback calls; the links are
// blocking (a reader thread per stream and a sender that must block for
// back-pressure), so those would need a hand-off between threads for every
// frame. The synchronous stream classes are public; only the factory and the
// handler that the generated code also uses are in grpc::internal.
#ifndef GPIPE_SERVICES_TRANSPORT_EXCHANGE_METHOD_H_
#define GPIPE_SERVICES_TRANSPORT_EXCHANGE_METHOD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpipe/v1/stage.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/impl/service_type.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "services/transport/control_stream.h"

namespace gpipe {

inline constexpr char kExchangeMethod[] = "/gpipe.v1.Stage/Exchange";

using ExchangeClientStream =
    grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
using ExchangeServerStream =
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

// Starts an Exchange call on `channel`.
std::unique_ptr<ExchangeClientStream> StartExchange(
    grpc::Channel* channel, grpc::ClientContext* context);

// Serves gpipe.v1.Stage with byte-buffer streams; register it with a
// grpc::ServerBuilder in place of the generated Stage::Service.
class ExchangeService : public grpc::Service {
 public:
  ExchangeService();
  virtual grpc::Status Exchange(grpc::ServerContext* context,
                                ExchangeServerStream* stream) = 0;
};

// The server's side of one Exchange stream, for an ExchangeLink.
class ServerFrameStream final : public FrameStream {
 public:
  ServerFrameStream(grpc::ServerContext* context, ExchangeServerStream* stream)
      : context_(context), stream_(stream) {}
  bool Read(grpc::ByteBuffer* buffer) override { return stream_->Read(buffer); }
  bool Write(const grpc::ByteBuffer& buffer) override {
    return stream_->Write(buffer);
  }
  void Cancel() override { context_->TryCancel(); }

 private:
  grpc::ServerContext* context_;
  ExchangeServerStream* stream_;
};

// Reads the stream's first frame, which must be OPEN: CANCELLED when the
// stream ends first, INVALID_ARGUMENT for anything else.
absl::StatusOr<gpipe::v1::Frame> ReadOpenFrame(ExchangeServerStream* stream);

// absl::Status -> grpc::Status with the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_EXCHANGE_METHOD_H_
