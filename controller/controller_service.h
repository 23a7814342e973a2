// The gpipe.v1.Controller gRPC service (synchronous API): turns requests
// and streams into calls on the Controller and absl::Status into
// grpc::Status.
#ifndef GPIPE_CONTROLLER_CONTROLLER_SERVICE_H_
#define GPIPE_CONTROLLER_CONTROLLER_SERVICE_H_

#include "controller/controller.h"
#include "controller/stage_file_transfers.h"
#include "gpipe/v1/controller.grpc.pb.h"
#include "services/security/bearer_token.h"

namespace gpipe::controller {

// Who may call what: bearer tokens for the job API (every method but
// Attach) and for workers attaching. A verifier without tokens lets every
// call through (no token file given).
struct ServiceAuth {
  security::TokenVerifier api;
  security::TokenVerifier workers;
};

class ControllerService final : public gpipe::v1::Controller::Service {
 public:
  explicit ControllerService(Controller& controller, ServiceAuth auth = {})
      : controller_(controller),
        auth_(std::move(auth)),
        transfers_(controller.options().transfers) {}

  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const gpipe::v1::SubmitJobRequest* request,
                         gpipe::v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context,
                      const gpipe::v1::GetJobRequest* request,
                      gpipe::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const gpipe::v1::ListJobsRequest* request,
                        gpipe::v1::ListJobsResponse* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context,
                         const gpipe::v1::DeleteJobRequest* request,
                         gpipe::v1::DeleteJobResponse* response) override;
  grpc::Status ResumeJob(grpc::ServerContext* context,
                         const gpipe::v1::ResumeJobRequest* request,
                         gpipe::v1::Job* response) override;
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
  // The worker token first (else UNAUTHENTICATED), then hello (else
  // FAILED_PRECONDITION), then reports up and assignments
  // down until either side ends the stream.
  grpc::Status Attach(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<gpipe::v1::ControllerMessage,
                               gpipe::v1::WorkerMessage>* stream) override;
  // Stage files through the controller: the worker token, then the
  // epoch's stream key (Controller::StageFileDestination, CheckpointToFetch).
  grpc::Status UploadStageFile(
      grpc::ServerContext* context,
      grpc::ServerReader<gpipe::v1::UploadStageFileRequest>* reader,
      gpipe::v1::UploadStageFileResponse* response) override;
  grpc::Status FetchModel(
      grpc::ServerContext* context, const gpipe::v1::FetchModelRequest* request,
      grpc::ServerWriter<gpipe::v1::FetchModelResponse>* writer) override;
  grpc::Status FetchCheckpoint(
      grpc::ServerContext* context,
      const gpipe::v1::FetchCheckpointRequest* request,
      grpc::ServerWriter<gpipe::v1::FetchCheckpointResponse>* writer) override;

 private:
  // UNAUTHENTICATED (logged with the peer) unless the call carries a job
  // API token.
  grpc::Status CheckApiToken(const grpc::ServerContext& context,
                             const char* rpc) const;

  Controller& controller_;
  const ServiceAuth auth_;
  StageFileTransfers transfers_;
};

// The same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_CONTROLLER_SERVICE_H_
