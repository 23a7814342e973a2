#include "controller/controller_service.h"

#include <atomic>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "grpc/grpc_security_constants.h"
#include "services/core/host_port.h"
#include "services/core/log.h"
#include "services/storage/checkpoint_layout.h"
#include "services/storage/file_io.h"
#include "services/storage/manifest.h"

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

// A worker that listens on every interface and was not told what to
// advertise says "0.0.0.0:7071", which its neighbour would dial as itself:
// it is reachable at the address its Attach came from.
grpc::Status ResolveWildcard(const std::string& peer, v1::WorkerHello* hello) {
  absl::StatusOr<HostPort> said = ParseHostPort(hello->address());
  if (!said.ok() || !IsWildcardHost(said->host)) return grpc::Status::OK;
  const std::optional<std::string> ip = PeerIp(peer);
  if (!ip.has_value()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        "the worker advertises " + hello->address() +
            ", which nobody can dial, and its Attach came over " + peer +
            ": start it with --advertise HOST:PORT");
  }
  const std::string resolved = JoinHostPort(*ip, said->port);
  LogInfo(
      "worker %s listens on %s; registered as %s (where its Attach "
      "came from)",
      hello->worker_id(), hello->address(), resolved);
  hello->set_address(resolved);
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
  return Reply(controller_.ListJobs(*request), response);
}

grpc::Status ControllerService::DeleteJob(grpc::ServerContext* context,
                                          const v1::DeleteJobRequest* request,
                                          v1::DeleteJobResponse* response) {
  if (grpc::Status s = CheckApiToken(*context, "DeleteJob"); !s.ok()) return s;
  return ToGrpcStatus(controller_.DeleteJob(request->job_id()));
}

grpc::Status ControllerService::ResumeJob(grpc::ServerContext* context,
                                          const v1::ResumeJobRequest* request,
                                          v1::Job* response) {
  if (grpc::Status s = CheckApiToken(*context, "ResumeJob"); !s.ok()) return s;
  return Reply(controller_.ResumeJob(*request), response);
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

grpc::Status ControllerService::UploadStageFile(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::UploadStageFileRequest>* reader,
    v1::UploadStageFileResponse* response) {
  if (grpc::Status s = auth_.workers.Check(*context, "uploading a stage file");
      !s.ok()) {
    LogWarning("refused an upload from %s: %s", context->peer(),
               s.error_message());
    return s;
  }
  absl::StatusOr<v1::UploadStageFileResponse> received = transfers_.Receive(
      [reader](v1::UploadStageFileRequest* m) { return reader->Read(m); },
      [this](const v1::StageFileHeader& header) {
        return controller_.StageFileDestination(header);
      });
  if (!received.ok()) {
    LogWarning("an upload from %s failed: %s", context->peer(),
               received.status().ToString());
  }
  return Reply(std::move(received), response);
}

grpc::Status ControllerService::FetchModel(
    grpc::ServerContext* context, const v1::FetchModelRequest* request,
    grpc::ServerWriter<v1::FetchModelResponse>* writer) {
  if (grpc::Status s = CheckApiToken(*context, "FetchModel"); !s.ok()) return s;
  absl::StatusOr<std::string> path = controller_.ModelToFetch(*request);
  if (!path.ok()) return ToGrpcStatus(path.status());
  std::vector<StageFileTransfers::FileToSend> files;
  if (request->step() == 0) {
    // Checked against the digest written with it (none for a model of an
    // older controller): a file damaged on this disk was sent as it was.
    std::string sha256;
    if (absl::StatusOr<std::string> recorded =
            storage::ReadWholeFile(storage::ModelDigestPath(*path));
        recorded.ok()) {
      sha256 = std::string(absl::StripAsciiWhitespace(*recorded));
    }
    files.push_back({*path, "model.safetensors", sha256});
  } else {
    // Off the controller's lock: the manifest and the files it names.
    absl::StatusOr<v1::CheckpointManifest> manifest =
        storage::ReadManifest(*path);
    if (!manifest.ok()) return ToGrpcStatus(manifest.status());
    files.push_back({*path, storage::kManifestName, ""});
    // The job's spec beside it, where the commit wrote one.
    const std::filesystem::path spec =
        std::filesystem::path(*path).parent_path() / storage::kJobSpecName;
    std::error_code error;
    if (std::filesystem::is_regular_file(spec, error)) {
      files.push_back({spec.string(), storage::kJobSpecName, ""});
    }
    for (const v1::CheckpointFile& f : manifest->files()) {
      files.push_back({storage::ManifestFilePath(*path, f),
                       std::filesystem::path(f.path()).filename().string(),
                       f.sha256()});
    }
  }
  absl::Status sent = transfers_.SendFiles(
      files,
      [writer](const v1::FetchModelResponse& m) { return writer->Write(m); });
  if (!sent.ok()) {
    LogWarning("a model fetch of %s from %s failed: %s", request->job_id(),
               context->peer(), sent.ToString());
  }
  return ToGrpcStatus(sent);
}

grpc::Status ControllerService::FetchCheckpoint(
    grpc::ServerContext* context, const v1::FetchCheckpointRequest* request,
    grpc::ServerWriter<v1::FetchCheckpointResponse>* writer) {
  if (grpc::Status s = auth_.workers.Check(*context, "fetching a checkpoint");
      !s.ok()) {
    LogWarning("refused a checkpoint fetch from %s: %s", context->peer(),
               s.error_message());
    return s;
  }
  absl::StatusOr<std::string> manifest =
      controller_.CheckpointToFetch(*request);
  if (!manifest.ok()) return ToGrpcStatus(manifest.status());
  absl::Status sent =
      transfers_.Send(*manifest, request->layer_begin(), request->layer_end(),
                      [writer](const v1::FetchCheckpointResponse& m) {
                        return writer->Write(m);
                      });
  if (!sent.ok()) {
    LogWarning("a checkpoint fetch from %s failed: %s", context->peer(),
               sent.ToString());
  }
  return ToGrpcStatus(sent);
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
  v1::WorkerHello hello = first.hello();
  if (grpc::Status s = ResolveWildcard(context->peer(), &hello); !s.ok()) {
    LogWarning("refused a worker's Attach from %s: %s", context->peer(),
               s.error_message());
    return s;
  }
  std::string certificate;
  if (std::shared_ptr<const grpc::AuthContext> auth = context->auth_context()) {
    for (const grpc::string_ref& pem :
         auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME)) {
      certificate.assign(pem.data(), pem.size());
    }
  }
  absl::StatusOr<std::shared_ptr<WorkerRecord>> attached =
      controller_.AttachWorker(hello, std::move(certificate),
                               [context] { context->TryCancel(); });
  if (!attached.ok()) return ToGrpcStatus(attached.status());
  WorkerRecord& worker = **attached;

  // Reports up on a reader thread; assignments down on this one. A sync
  // stream allows one reader and one writer at the same time.
  std::atomic<bool> reader_done{false};
  std::thread reader([&] {
    v1::WorkerMessage message;
    std::string why = "its Attach stream ended";
    bool drained = false;
    while (stream->Read(&message)) {
      // A goodbye (the worker is draining on SIGTERM) ends the stream as a
      // break does, without waiting for the lease.
      if (message.has_goodbye()) {
        why = "it said goodbye (" + message.goodbye().reason() + ")";
        drained = true;
        break;
      }
      controller_.HandleMessage(worker, message);
    }
    reader_done = true;
    controller_.DetachWorker(worker, absl::OkStatus(), why, drained);
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
