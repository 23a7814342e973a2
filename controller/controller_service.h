// The gpipe.v1.Controller gRPC service (synchronous API): turns requests
// and streams into calls on the Controller and absl::Status into
// grpc::Status.
#ifndef GPIPE_CONTROLLER_CONTROLLER_SERVICE_H_
#define GPIPE_CONTROLLER_CONTROLLER_SERVICE_H_

#include "controller/controller.h"
#include "gpipe/v1/controller.grpc.pb.h"

namespace gpipe::controller {

class ControllerService final : public gpipe::v1::Controller::Service {
 public:
  explicit ControllerService(Controller& controller)
      : controller_(controller) {}

  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const gpipe::v1::SubmitJobRequest* request,
                         gpipe::v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context,
                      const gpipe::v1::GetJobRequest* request,
                      gpipe::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const gpipe::v1::ListJobsRequest* request,
                        gpipe::v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context,
                         const gpipe::v1::CancelJobRequest* request,
                         gpipe::v1::Job* response) override;
  grpc::Status WatchJob(
      grpc::ServerContext* context, const gpipe::v1::WatchJobRequest* request,
      grpc::ServerWriter<gpipe::v1::JobEvent>* writer) override;
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const gpipe::v1::ListWorkersRequest* request,
                           gpipe::v1::ListWorkersResponse* response) override;
  grpc::Status GetTrace(grpc::ServerContext* context,
                        const gpipe::v1::GetTraceRequest* request,
                        gpipe::v1::GetTraceResponse* response) override;
  // Hello first (else FAILED_PRECONDITION), then reports up and assignments
  // down until either side ends the stream.
  grpc::Status Attach(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<gpipe::v1::ControllerMessage,
                               gpipe::v1::WorkerMessage>* stream) override;

 private:
  Controller& controller_;
};

// The same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_CONTROLLER_SERVICE_H_
