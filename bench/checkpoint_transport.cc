#include "bench/checkpoint_transport.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "services/core/status.h"

namespace gpipe::bench {

namespace v1 = gpipe::v1;

absl::StatusOr<std::unique_ptr<ControllerTransportRig>>
ControllerTransportRig::Start(const std::filesystem::path& dir,
                              const v1::JobSpec& spec) {
  std::unique_ptr<ControllerTransportRig> rig(new ControllerTransportRig());
  controller::ControllerServerOptions options;
  options.listen = "127.0.0.1:0";
  options.controller.checkpoint_dir = dir.string();
  // The stand-in worker sends no heartbeats: a long lease instead.
  options.controller.heartbeat_timeout = absl::Hours(1);
  ASSIGN_OR_RETURN(rig->server_, controller::ControllerServer::Start(options));
  rig->channel_ = grpc::CreateChannel(rig->server_->address(),
                                      grpc::InsecureChannelCredentials());
  rig->stub_ = v1::Controller::NewStub(rig->channel_);
  rig->attach_ = rig->stub_->Attach(&rig->attach_context_);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id("checkpoint-bench");
  hello.mutable_hello()->set_address("127.0.0.1:1");
  v1::ControllerMessage in;
  if (!rig->attach_->Write(hello) || !rig->attach_->Read(&in) ||
      !in.has_welcome()) {
    return absl::UnavailableError("the controller sent no welcome");
  }
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  if (grpc::Status s = rig->stub_->SubmitJob(&context, request, &job);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SubmitJob: ", s.error_message()));
  }
  rig->job_id_ = job.id();
  if (!rig->attach_->Read(&in) || !in.has_assignment()) {
    return absl::UnavailableError("the controller sent no assignment");
  }
  rig->assignment_ = in.assignment();
  rig->files_ = std::make_unique<ControllerFileStore>(
      rig->channel_, security::ClientSecurity{});
  return rig;
}

ControllerTransportRig::~ControllerTransportRig() {
  attach_context_.TryCancel();
  if (attach_) attach_->Finish();
  if (server_) server_->Shutdown(absl::Seconds(1));
}

absl::StatusOr<StageFileStore::Stored> ControllerTransportRig::Upload(
    Stage& stage, int64_t step) {
  return files_->SaveCheckpoint(assignment_, stage, step);
}

absl::Status ControllerTransportRig::Commit(
    int64_t step, const StageFileStore::Stored& stored) {
  const v1::WorkerMessage m = CheckpointedReport(assignment_, step, stored);
  if (!attach_->Write(m)) {
    return absl::UnavailableError("the Attach stream broke");
  }
  const absl::Time deadline = absl::Now() + absl::Minutes(2);
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_job_id(job_id_);
    v1::Job job;
    if (grpc::Status s = stub_->GetJob(&context, request, &job); !s.ok()) {
      return absl::UnavailableError(s.error_message());
    }
    for (const v1::CheckpointRef& ref : job.status().checkpoints()) {
      if (ref.step() == step) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("the checkpoint of step ", step, " was not committed"));
}

absl::StatusOr<int64_t> ControllerTransportRig::Fetch(Stage& stage,
                                                      int64_t step) {
  v1::Assignment a = assignment_;
  a.set_restore_step(step);
  return files_->Restore(a, stage);
}

}  // namespace gpipe::bench
