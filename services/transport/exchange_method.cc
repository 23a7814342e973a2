#include "services/transport/exchange_method.h"

#include <string>

#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/impl/rpc_service_method.h"
#include "grpcpp/support/method_handler.h"
#include "services/transport/frame_wire.h"

namespace gpipe {

std::unique_ptr<ExchangeClientStream> StartExchange(
    grpc::Channel* channel, grpc::ClientContext* context) {
  const grpc::internal::RpcMethod method(
      kExchangeMethod, grpc::internal::RpcMethod::BIDI_STREAMING);
  return std::unique_ptr<ExchangeClientStream>(
      grpc::internal::ClientReaderWriterFactory<
          grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel, method,
                                                      context));
}

ExchangeService::ExchangeService() {
  AddMethod(new grpc::internal::RpcServiceMethod(
      kExchangeMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
      new grpc::internal::BidiStreamingHandler<
          ExchangeService, grpc::ByteBuffer, grpc::ByteBuffer>(
          [](ExchangeService* service, grpc::ServerContext* context,
             ExchangeServerStream* stream) {
            return service->Exchange(context, stream);
          },
          this)));
}

absl::StatusOr<gpipe::v1::Frame> ReadOpenFrame(ExchangeServerStream* stream) {
  grpc::ByteBuffer buffer;
  if (!stream->Read(&buffer)) {
    return absl::CancelledError("the stream ended before its first frame");
  }
  ReceivedFrame open;
  if (absl::Status s = DecodeFrame(buffer, &open); !s.ok()) return s;
  if (open.fields().kind() != gpipe::v1::OPEN || open.payload_size() != 0) {
    return absl::InvalidArgumentError(
        "the first frame of an Exchange must be OPEN");
  }
  return open.fields();
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace gpipe
