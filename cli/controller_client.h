// gpipectl's client of the controller API: one channel, a deadline on every
// unary call, keepalive on the watch stream, and every gRPC failure turned
// into a message about the user's problem ("cannot reach the controller at
// ADDR") instead of transport internals.
#ifndef GPIPE_CLI_CONTROLLER_CLIENT_H_
#define GPIPE_CLI_CONTROLLER_CLIENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cli/model_download.h"
#include "gpipe/v1/controller.grpc.pb.h"
#include "gpipe/v1/controller.pb.h"
#include "grpcpp/grpcpp.h"
#include "services/security/client_security.h"

namespace gpipe::cli {

class ControllerClient {
 public:
  // `address` is host:port; `timeout` bounds each unary call; `security`:
  // TLS and the job API token (default: plaintext, no token).
  explicit ControllerClient(std::string address,
                            absl::Duration timeout = absl::Seconds(10),
                            security::ClientSecurity security = {});

  const std::string& address() const { return address_; }

  absl::StatusOr<gpipe::v1::Job> SubmitJob(const gpipe::v1::JobSpec& spec);
  absl::StatusOr<gpipe::v1::Job> GetJob(const std::string& job_id);
  absl::StatusOr<gpipe::v1::ListJobsResponse> ListJobs();
  absl::StatusOr<gpipe::v1::Job> CancelJob(const std::string& job_id);
  absl::StatusOr<gpipe::v1::Job> ResumeJob(const std::string& job_id,
                                           int64_t steps);
  // An ended job, its checkpoints and its model.
  absl::Status DeleteJob(const std::string& job_id);
  absl::StatusOr<gpipe::v1::ListWorkersResponse> ListWorkers();
  // FetchModel into `dir` (cli/model_download.h): the final model (step 0)
  // or a committed checkpoint's manifest and files. A stream cut by the
  // network (UNAVAILABLE) is fetched again, up to `attempts` times in all
  // and for at most the client's timeout after the first cut;
  // any other failure is returned, leaving no file of this fetch behind.
  absl::StatusOr<std::vector<DownloadedFile>> FetchModel(
      const std::string& job_id, int64_t step, const std::string& dir,
      int attempts = 3);
  absl::StatusOr<gpipe::v1::GetTraceResponse> GetTrace(
      const gpipe::v1::GetTraceRequest& request);

  // Follows the job's event stream, calling `on_event` for each event, until
  // the job reaches a terminal state (returns OK), the stream fails (the
  // error), or `stop` returns true (CANCELLED "interrupted"; polled about
  // every 100 ms, from another thread). A stream that breaks while the
  // controller is briefly unreachable (a restart) is reopened for up to
  // `reconnect_for`.
  absl::Status WatchJob(
      const std::string& job_id,
      const std::function<void(const gpipe::v1::JobEvent&)>& on_event,
      const std::function<bool()>& stop,
      absl::Duration reconnect_for = absl::Seconds(30),
      const std::function<void()>& on_resumed = nullptr);

  // The user-facing form of a failed call's status; `rpc` names the call.
  // A refused token or a failed TLS handshake says which flag to look at.
  absl::Status UserStatus(const grpc::Status& status, const char* rpc) const;
  // A call the controller accepted and did not answer within timeout_.
  absl::Status NoAnswer() const;

 private:
  // The deadline and the token.
  void SetDeadline(grpc::ClientContext* context) const;
  // An UNAVAILABLE that is a TLS mismatch, in words; nullopt otherwise.
  std::optional<absl::Status> TlsProblem(const grpc::Status& status) const;

  std::string address_;
  absl::Duration timeout_;
  security::ClientSecurity security_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<gpipe::v1::Controller::Stub> stub_;
};

// Whether a job in this state will change no more.
bool IsTerminal(gpipe::v1::JobState state);

}  // namespace gpipe::cli

#endif  // GPIPE_CLI_CONTROLLER_CLIENT_H_
