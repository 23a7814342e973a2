// The worker's Stage service: accepts the upstream stage's Exchange stream,
// checks that it belongs to this worker's job and epoch, and hands it to the
// executor as the stage's upstream link.
#ifndef GPIPE_WORKER_STAGE_SERVICE_H_
#define GPIPE_WORKER_STAGE_SERVICE_H_

#include "gpipe/v1/stage.grpc.pb.h"
#include "worker/executor.h"

namespace gpipe {

class StageService final : public gpipe::v1::Stage::Service {
 public:
  // `link_wait_ms`: how long a link may wait for its assignment to arrive.
  StageService(Executor* executor, int64_t link_wait_ms)
      : executor_(executor), link_wait_ms_(link_wait_ms) {}

  grpc::Status Exchange(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<gpipe::v1::Frame, gpipe::v1::Frame>* stream)
      override;

 private:
  Executor* executor_;
  int64_t link_wait_ms_;
};

// absl::Status -> grpc::Status with the same code and message.
grpc::Status ToGrpc(const absl::Status& s);

}  // namespace gpipe

#endif  // GPIPE_WORKER_STAGE_SERVICE_H_
