// A request that does not parse as its method's message is the caller's
// error: gRPC answers it with INTERNAL and an empty message (protobuf's
// parse failure names nothing in proto3). This server interceptor turns
// that answer into INVALID_ARGUMENT naming the method, for the methods that
// take one request (unary and server-streaming); a stream's bad message
// ends the stream in its handler instead.
#ifndef GPIPE_CONTROLLER_UNPARSABLE_REQUEST_H_
#define GPIPE_CONTROLLER_UNPARSABLE_REQUEST_H_

#include <memory>
#include <vector>

#include "grpcpp/support/server_interceptor.h"

namespace gpipe::controller {

// For ServerBuilder::experimental().SetInterceptorCreators.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
UnparsableRequestInterceptorFactory();

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_UNPARSABLE_REQUEST_H_
