#include "controller/controller_service.h"

#include <atomic>
#include <string>
#include <thread>

#include "services/core/log.h"

namespace gpipe::controller {

namespace v1 = gpipe::v1;

namespace {

// How often a stream handler that is waiting checks whether its call is
// still alive.
constexpr absl::Duration kPollInterval = absl::Milliseconds(100);

// `result`'s value into `response`, or its status.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::Status ControllerService::CheckApiToken(
    const grpc::ServerContext& context, const char* rpc) const {
  grpc::Status checked = auth_.api.Check(context, "the job API");
  if (!checked.ok()) {
    LogWarning("refused %s from %s: %s", rpc, context.peer(),
               checked.error_message());
  }
  return checked;
}

grpc::Status ControllerService::SubmitJob(grpc::ServerContext* context,
                                          const v1::SubmitJobRequest* request,
                                          v1::Job* response) {
  if (grpc::Status s = CheckApiToken(*context, "SubmitJob"); !s.ok()) return s;
  return Reply(controller_.SubmitJob(request->spec()), response);
}

grpc::Status ControllerService::GetJob(grpc::ServerContext* context,
                                       const v1::GetJobRequest* request,
                                       v1::Job* response) {
  if (grpc::Status s = CheckApiToken(*context, "GetJob"); !s.ok()) return s;
  return Reply(controller_.GetJob(request->job_id()), response);
}

grpc::Status ControllerService::ListJobs(grpc::ServerContext* context,
                                         const v1::ListJobsRequest* request,
                                         v1::ListJobsResponse* response) {
  if (grpc::Status s = CheckApiToken(*context, "ListJobs"); !s.ok()) return s;
  for (v1::Job& job : controller_.ListJobs()) {
    *response->add_jobs() = std::move(job);
  }
  return grpc::Status::OK;
}

grpc::Status ControllerService::CancelJob(grpc::ServerContext* context,
                                          const v1::CancelJobRequest* request,
                                          v1::Job* response) {
  if (grpc::Status s = CheckApiToken(*context, "CancelJob"); !s.ok()) return s;
  return Reply(controller_.CancelJob(request->job_id()), response);
}

grpc::Status ControllerService::WatchJob(
    grpc::ServerContext* context, const v1::WatchJobRequest* request,
    grpc::ServerWriter<v1::JobEvent>* writer) {
  if (grpc::Status s = CheckApiToken(*context, "WatchJob"); !s.ok()) return s;
  return ToGrpcStatus(controller_.WatchJob(
      request->job_id(), [context] { return context->IsCancelled(); },
      [writer](const v1::JobEvent& event) { return writer->Write(event); }));
}

grpc::Status ControllerService::ListWorkers(
    grpc::ServerContext* context, const v1::ListWorkersRequest* request,
    v1::ListWorkersResponse* response) {
  if (grpc::Status s = CheckApiToken(*context, "ListWorkers"); !s.ok())
    return s;
  for (v1::WorkerInfo& worker : controller_.ListWorkers()) {
    *response->add_workers() = std::move(worker);
  }
  return grpc::Status::OK;
}

grpc::Status ControllerService::GetTrace(grpc::ServerContext* context,
                                         const v1::GetTraceRequest* request,
                                         v1::GetTraceResponse* response) {
  if (grpc::Status s = CheckApiToken(*context, "GetTrace"); !s.ok()) return s;
  return Reply(controller_.GetTrace(*request), response);
}

grpc::Status ControllerService::Attach(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ControllerMessage, v1::WorkerMessage>*
        stream) {
  if (grpc::Status s = auth_.workers.Check(*context, "attaching a worker");
      !s.ok()) {
    LogWarning("refused a worker's Attach from %s: %s", context->peer(),
               s.error_message());
    return s;
  }
  v1::WorkerMessage first;
  if (!stream->Read(&first)) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "the stream ended before hello");
  }
  if (!first.has_hello()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "first message must be hello");
  }
  absl::StatusOr<std::shared_ptr<WorkerRecord>> attached =
      controller_.AttachWorker(first.hello(),
                               [context] { context->TryCancel(); });
  if (!attached.ok()) return ToGrpcStatus(attached.status());
  WorkerRecord& worker = **attached;

  // Reports up on a reader thread; assignments down on this one. A sync
  // stream allows one reader and one writer at the same time.
  std::atomic<bool> reader_done{false};
  std::thread reader([&] {
    v1::WorkerMessage message;
    std::string why = "its Attach stream ended";
    while (stream->Read(&message)) {
      // A goodbye (the worker is draining on SIGTERM) ends the stream as a
      // break does, without waiting for the lease.
      if (message.has_goodbye()) {
        why = "it said goodbye (" + message.goodbye().reason() + ")";
        break;
      }
      controller_.HandleMessage(worker, message);
    }
    reader_done = true;
    controller_.DetachWorker(worker, absl::OkStatus(), why);
  });
  absl::Status end;
  while (true) {
    Outgoing next = controller_.NextMessage(worker, kPollInterval);
    if (next.end.has_value()) {
      end = *next.end;
      break;
    }
    if (next.message.has_value()) {
      if (!stream->Write(*next.message)) {
        end = absl::UnavailableError("a write to the Attach stream failed");
        controller_.DetachWorker(worker, end,
                                 "a write to its Attach stream failed");
        break;
      }
    } else if (context->IsCancelled()) {
      end = absl::CancelledError("the Attach call was cancelled");
      controller_.DetachWorker(worker, end, "its Attach call was cancelled");
      break;
    }
  }
  if (!reader_done) context->TryCancel();  // unblocks the reader's Read
  reader.join();
  return ToGrpcStatus(end);
}

}  // namespace gpipe::controller
