#include "controller/unparsable_request.h"

#include <string>

#include "grpcpp/support/interceptor.h"
#include "grpcpp/support/status.h"

namespace gpipe::controller {
namespace {

using grpc::experimental::InterceptionHookPoints;

class UnparsableRequestInterceptor final
    : public grpc::experimental::Interceptor {
 public:
  explicit UnparsableRequestInterceptor(std::string method)
      : method_(std::move(method)) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    // The one request of the call arrived, but not as a message.
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ &&
        methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::INTERNAL) {
      methods->ModifySendStatus(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "the request to " + method_ +
                           " does not parse as its protobuf message"));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool unparsed_ = false;
};

class Factory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    using Type = grpc::experimental::ServerRpcInfo::Type;
    if (info->type() != Type::UNARY && info->type() != Type::SERVER_STREAMING) {
      return nullptr;
    }
    return new UnparsableRequestInterceptor(info->method());
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
UnparsableRequestInterceptorFactory() {
  return std::make_unique<Factory>();
}

}  // namespace gpipe::controller
