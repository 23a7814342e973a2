// The worker's Stage service: accepts the upstream stage's Exchange stream,
// checks that it belongs to this worker's job and epoch and carries the
// assignment's stream key (PERMISSION_DENIED otherwise), and hands it to the
// executor as the stage's upstream link. Frames travel as raw byte buffers
// (services/transport/exchange_method.h), so payloads are not copied through
// protobuf strings.
#ifndef GPIPE_WORKER_STAGE_SERVICE_H_
#define GPIPE_WORKER_STAGE_SERVICE_H_

// The generated stub of the same service: what other clients (tools,
// tests) of this worker call.
#include <functional>

#include "gpipe/v1/stage.grpc.pb.h"
#include "services/transport/exchange_method.h"
#include "worker/executor.h"

namespace gpipe {

class StageService final : public ExchangeService {
 public:
  // `link_wait_ms`: how long a link may wait for its assignment to arrive.
  StageService(Executor* executor, int64_t link_wait_ms)
      : executor_(executor), link_wait_ms_(link_wait_ms) {}

  // Called with the reason of every refused stream (a metric counts them).
  // Set before the server starts.
  void set_on_rejected(std::function<void(const absl::Status&)> f) {
    on_rejected_ = std::move(f);
  }

  grpc::Status Exchange(grpc::ServerContext* context,
                        ExchangeServerStream* stream) override;

 private:
  Executor* executor_;
  int64_t link_wait_ms_;
  std::function<void(const absl::Status&)> on_rejected_;
};

// absl::Status -> grpc::Status with the same code and message.
inline grpc::Status ToGrpc(const absl::Status& s) { return ToGrpcStatus(s); }

}  // namespace gpipe

#endif  // GPIPE_WORKER_STAGE_SERVICE_H_
