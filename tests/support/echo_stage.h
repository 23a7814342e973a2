// A downstream stage for the link tests: on each Exchange stream it runs a
// real GrpcLink on the data plane it is given and sends every message
// straight back (activations as gradients, scalars in kind), served by a
// gRPC server on a free loopback port.
#ifndef GPIPE_TESTS_SUPPORT_ECHO_STAGE_H_
#define GPIPE_TESTS_SUPPORT_ECHO_STAGE_H_

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "services/transport/data_plane.h"
#include "services/transport/exchange_method.h"

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

}  // namespace gpipe::test_support

#endif  // GPIPE_TESTS_SUPPORT_ECHO_STAGE_H_
