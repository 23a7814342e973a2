#include "cli/controller_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace gpipe::cli {
namespace {

// A watch may sit quiet for long (a job pending for workers), and a frozen
// controller (a stopped process, a partitioned node) closes nothing: only
// pings find it. Our controller takes a ping every 5 s while it sends
// nothing (controller_server.cc) where gRPC's default strikes a client that
// pings more often than every 5 minutes; every 10 s, with 10 s to answer,
// finds a frozen one within 20 s (at 330 s, a watch or a fetch mid-file
// hung for minutes).
constexpr int kKeepaliveTimeMs = 10 * 1000;
constexpr int kKeepaliveTimeoutMs = 10 * 1000;
constexpr absl::Duration kPoll = absl::Milliseconds(100);
constexpr int kReconnectMs = 1000;
constexpr int kMaxReceiveBytes = 256 << 20;

absl::StatusCode ToAbsl(grpc::StatusCode code) {
  return static_cast<absl::StatusCode>(static_cast<int>(code));
}

std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, const security::ClientSecurity& security) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // Keepalive pings on a stream that only receives must not be held back
  // waiting for the client to send data.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A controller that restarts is back within seconds: try to connect
  // once a second, as watch and fetch retry. gRPC's backoff grew to tens
  // of seconds, and a watch resumed 17 s after a 3 s restart.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kReconnectMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kReconnectMs);
  // GetTrace of a long pipeline is large (16 kept steps x K stages x
  // 3M+1 ops: K=8, M=1024 is about 15 MB), beyond gRPC's 4 MB default.
  args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
  security.ApplyTo(args);
  return grpc::CreateCustomChannel(address, security.Credentials(), args);
}

// Watches a stream call from a second thread (Read() blocks): cancels it
// when `stop` says so, or when `first_answer` has passed without the
// controller's first message and without a connection to it. A frozen
// controller's kernel accepts the connection, but its gRPC never answers
// the handshake, so --timeout is the answer there (keepalive pings found it
// only after 20 s, whatever --timeout said). A connected controller may be
// slow to answer for good reasons (a fetch waits for one of its transfer
// slots), and the pings find it if it freezes.
class StreamGuard {
 public:
  StreamGuard(grpc::ClientContext* context, grpc::Channel* channel,
              absl::Duration first_answer, std::function<bool()> stop)
      : context_(context),
        channel_(channel),
        answer_by_(absl::Now() + first_answer),
        stop_(std::move(stop)),
        thread_([this] { Run(); }) {}
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;
  ~StreamGuard() { Finish(); }

  void Answered() { answered_ = true; }
  // Ends the watching; call after the stream's Finish().
  void Finish() {
    if (!finished_.HasBeenNotified()) finished_.Notify();
    if (thread_.joinable()) thread_.join();
  }
  bool stopped() const { return stopped_; }
  bool unanswered() const { return unanswered_; }

 private:
  void Run() {
    while (!finished_.WaitForNotificationWithTimeout(kPoll)) {
      if (stop_ && stop_()) {
        stopped_ = true;
        context_->TryCancel();
        return;
      }
      if (!answered_.load() && absl::Now() >= answer_by_ &&
          channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
        unanswered_ = true;
        context_->TryCancel();
        return;
      }
    }
  }

  grpc::ClientContext* context_;
  grpc::Channel* channel_;
  const absl::Time answer_by_;
  const std::function<bool()> stop_;
  absl::Notification finished_;
  std::atomic<bool> answered_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> unanswered_{false};
  std::thread thread_;  // last: starts once the members it reads exist
};

}  // namespace

bool IsTerminal(gpipe::v1::JobState state) {
  return state == gpipe::v1::SUCCEEDED || state == gpipe::v1::FAILED ||
         state == gpipe::v1::CANCELLED;
}

ControllerClient::ControllerClient(std::string address, absl::Duration timeout,
                                   security::ClientSecurity security)
    : address_(std::move(address)),
      timeout_(timeout),
      security_(std::move(security)),
      channel_(MakeChannel(address_, security_)),
      stub_(gpipe::v1::Controller::NewStub(channel_)) {}

void ControllerClient::SetDeadline(grpc::ClientContext* context) const {
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(timeout_));
  security_.ApplyTo(context);
}

std::optional<absl::Status> ControllerClient::TlsProblem(
    const grpc::Status& status) const {
  const std::string message = absl::AsciiStrToLower(status.error_message());
  const bool handshake = absl::StrContains(message, "ssl") ||
                         absl::StrContains(message, "tls") ||
                         absl::StrContains(message, "handshake") ||
                         absl::StrContains(message, "certificate");
  if (security_.secure() && handshake) {
    return absl::UnavailableError(absl::StrCat(
        "TLS handshake with ", address_,
        " failed: is the controller using TLS, is its certificate signed by "
        "--tls_ca and issued for the name dialled (else --tls_server_name), "
        "and ours by its CA? (",
        status.error_message(), ")"));
  }
  // A server that requires a client certificate ends the handshake with
  // little said; the detail is all the client has.
  if (security_.secure()) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the controller at ", address_,
        " over TLS: is gpipe-controller running, and does it require a "
        "client certificate (--tls_cert, --tls_key)? (",
        status.error_message(), ")"));
  }
  // A TLS server closes a plaintext connection as soon as it reads it.
  if (!security_.secure() &&
      (handshake || absl::StrContains(message, "socket closed") ||
       absl::StrContains(message, "connection reset"))) {
    return absl::UnavailableError(absl::StrCat(
        "the controller at ", address_,
        " closed the plaintext connection: is the controller using TLS? "
        "(--tls_ca, with --tls_cert and --tls_key for mutual TLS)"));
  }
  return std::nullopt;
}

absl::Status ControllerClient::NoAnswer() const {
  return absl::DeadlineExceededError(
      absl::StrCat("the controller at ", address_, " did not answer within ",
                   absl::FormatDuration(timeout_)));
}

absl::Status ControllerClient::UserStatus(const grpc::Status& status,
                                          const char* rpc) const {
  const absl::StatusCode code = ToAbsl(status.error_code());
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      return absl::OkStatus();
    case grpc::StatusCode::UNAVAILABLE:
      if (std::optional<absl::Status> tls = TlsProblem(status)) return *tls;
      return absl::UnavailableError(
          absl::StrCat("cannot reach the controller at ", address_,
                       " (is gpipe-controller running?)"));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return NoAnswer();
    case grpc::StatusCode::CANCELLED:
      return absl::CancelledError("interrupted");
    case grpc::StatusCode::UNIMPLEMENTED:
      return absl::UnimplementedError(
          absl::StrCat("the server at ", address_, " does not implement ", rpc,
                       " (is it a gpipe-controller of this version?)"));
    case grpc::StatusCode::UNAUTHENTICATED:
      return absl::UnauthenticatedError(
          absl::StrCat("the controller refused the token (UNAUTHENTICATED): ",
                       status.error_message(),
                       security_.token.empty()
                           ? "; give one with --token_file or $GPIPE_TOKEN"
                           : "; check --token_file or $GPIPE_TOKEN"));
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      if (!status.error_message().empty())
        return absl::Status(code, status.error_message());
      break;
    default:
      break;
  }
  return absl::Status(
      code,
      absl::StrCat("the controller at ", address_, " failed ", rpc, ": ",
                   status.error_message().empty() ? std::string("no details")
                                                  : status.error_message()));
}

absl::StatusOr<gpipe::v1::Job> ControllerClient::SubmitJob(
    const gpipe::v1::JobSpec& spec) {
  grpc::ClientContext context;
  SetDeadline(&context);
  gpipe::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  gpipe::v1::Job job;
  grpc::Status s = stub_->SubmitJob(&context, request, &job);
  if (!s.ok()) return UserStatus(s, "SubmitJob");
  return job;
}

absl::StatusOr<gpipe::v1::Job> ControllerClient::GetJob(
    const std::string& job_id) {
  grpc::ClientContext context;
  SetDeadline(&context);
  gpipe::v1::GetJobRequest request;
  request.set_job_id(job_id);
  gpipe::v1::Job job;
  grpc::Status s = stub_->GetJob(&context, request, &job);
  if (!s.ok()) return UserStatus(s, "GetJob");
  return job;
}

absl::StatusOr<gpipe::v1::GetTraceResponse> ControllerClient::GetTrace(
    const gpipe::v1::GetTraceRequest& request) {
  grpc::ClientContext context;
  SetDeadline(&context);
  gpipe::v1::GetTraceResponse trace;
  grpc::Status s = stub_->GetTrace(&context, request, &trace);
  if (!s.ok()) return UserStatus(s, "GetTrace");
  return trace;
}

absl::StatusOr<std::vector<DownloadedFile>> ControllerClient::FetchModel(
    const std::string& job_id, int64_t step, const std::string& dir,
    int attempts) {
  gpipe::v1::FetchModelRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  absl::Status last;
  // Reconnecting waits at most the client's timeout after a cut, counted
  // afresh after an attempt that received something (the stream itself
  // has no deadline).
  absl::Time give_up = absl::InfiniteFuture();
  bool received = false;
  for (int attempt = 0; attempt < attempts; ++attempt) {
    if (attempt > 0) {
      const absl::Time now = absl::Now();
      if (give_up == absl::InfiniteFuture() || received) {
        give_up = now + timeout_;
      }
      received = false;
      if (now >= give_up) break;
      // The channel backs off its reconnects; wait (bounded) until it is
      // connected again rather than fail fast in its backoff.
      absl::SleepFor(std::min(absl::Seconds(attempt), give_up - now));
      channel_->WaitForConnected(absl::ToChronoTime(give_up));
    }
    // No deadline for the whole stream: a model may take minutes; a dead
    // connection ends it as UNAVAILABLE.
    grpc::ClientContext context;
    security_.ApplyTo(&context);
    StreamGuard guard(&context, channel_.get(), timeout_, nullptr);
    auto stream = stub_->FetchModel(&context, request);
    bool ended = false;
    absl::StatusOr<ReceivedFiles> files = ReceiveModelFiles(
        [&](gpipe::v1::FetchModelResponse* m) {
          ended = !stream->Read(m);
          if (!ended) guard.Answered();
          received = received || !ended;
          return !ended;
        },
        dir);
    // Cancelled only when we stopped reading: a stream that ended has the
    // controller's reason in its status (a checkpoint file that no longer
    // matches its manifest), which a cancel would replace.
    if (!files.ok() && !ended) {
      // Our own failure (a folder that cannot be made, a full disk): its
      // reason, not the cancel's "interrupted".
      context.TryCancel();
      (void)stream->Finish();
      return files.status();
    }
    const grpc::Status status = stream->Finish();
    guard.Finish();
    if (status.ok() && files.ok()) return files->Commit();
    if (guard.unanswered()) return NoAnswer();
    last = !status.ok() ? UserStatus(status, "FetchModel") : files.status();
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return last;
  }
  return last;
}

absl::StatusOr<gpipe::v1::ListJobsResponse> ControllerClient::ListJobs() {
  // Every page, one call each, into one answer.
  gpipe::v1::ListJobsResponse all;
  gpipe::v1::ListJobsRequest request;
  do {
    grpc::ClientContext context;
    SetDeadline(&context);
    gpipe::v1::ListJobsResponse page;
    grpc::Status s = stub_->ListJobs(&context, request, &page);
    if (!s.ok()) return UserStatus(s, "ListJobs");
    for (gpipe::v1::Job& job : *page.mutable_jobs()) {
      *all.add_jobs() = std::move(job);
    }
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return all;
}

absl::Status ControllerClient::DeleteJob(const std::string& job_id) {
  grpc::ClientContext context;
  SetDeadline(&context);
  gpipe::v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  gpipe::v1::DeleteJobResponse response;
  grpc::Status s = stub_->DeleteJob(&context, request, &response);
  if (!s.ok()) return UserStatus(s, "DeleteJob");
  return absl::OkStatus();
}

absl::StatusOr<gpipe::v1::Job> ControllerClient::ResumeJob(
    const std::string& job_id, int64_t steps) {
  grpc::ClientContext context;
  SetDeadline(&context);
  gpipe::v1::ResumeJobRequest request;
  request.set_job_id(job_id);
  request.set_steps(steps);
  gpipe::v1::Job job;
  grpc::Status s = stub_->ResumeJob(&context, request, &job);
  if (!s.ok()) return UserStatus(s, "ResumeJob");
  return job;
}

absl::StatusOr<gpipe::v1::Job> ControllerClient::CancelJob(
    const std::string& job_id) {
  grpc::ClientContext context;
  SetDeadline(&context);
  gpipe::v1::CancelJobRequest request;
  request.set_job_id(job_id);
  gpipe::v1::Job job;
  grpc::Status s = stub_->CancelJob(&context, request, &job);
  if (!s.ok()) return UserStatus(s, "CancelJob");
  return job;
}

absl::StatusOr<gpipe::v1::ListWorkersResponse> ControllerClient::ListWorkers() {
  grpc::ClientContext context;
  SetDeadline(&context);
  gpipe::v1::ListWorkersResponse response;
  grpc::Status s =
      stub_->ListWorkers(&context, gpipe::v1::ListWorkersRequest(), &response);
  if (!s.ok()) return UserStatus(s, "ListWorkers");
  return response;
}

absl::Status ControllerClient::WatchJob(
    const std::string& job_id,
    const std::function<void(const gpipe::v1::JobEvent&)>& on_event,
    const std::function<bool()>& stop, absl::Duration reconnect_for,
    const std::function<void()>& on_resumed) {
  bool ever_connected = false;
  absl::Time lost_since = absl::InfiniteFuture();
  for (;;) {
    if (stop()) return absl::CancelledError("interrupted");
    grpc::ClientContext context;  // no deadline: a job may run for days
    security_.ApplyTo(&context);
    gpipe::v1::WatchJobRequest request;
    request.set_job_id(job_id);

    StreamGuard guard(&context, channel_.get(), timeout_, stop);
    std::unique_ptr<grpc::ClientReader<gpipe::v1::JobEvent>> reader =
        stub_->WatchJob(&context, request);
    gpipe::v1::JobEvent event;
    bool terminal = false;
    while (!terminal && reader->Read(&event)) {
      if (lost_since != absl::InfiniteFuture()) {
        // Said, so that a step that goes back (a restarted controller
        // resumes from the last checkpoint) is not a silent surprise.
        std::fprintf(stderr,
                     "gpipectl: the watch of %s resumed after %s without the "
                     "controller at %s\n",
                     job_id.c_str(),
                     absl::FormatDuration(absl::Trunc(absl::Now() - lost_since,
                                                      absl::Seconds(1)))
                         .c_str(),
                     address_.c_str());
        if (on_resumed) on_resumed();
      }
      guard.Answered();
      ever_connected = true;
      lost_since = absl::InfiniteFuture();
      on_event(event);
      terminal = IsTerminal(event.job().status().state());
    }
    if (terminal) context.TryCancel();  // do not wait for the server's close
    grpc::Status status = reader->Finish();
    guard.Finish();
    if (terminal) return absl::OkStatus();
    if (guard.stopped()) return absl::CancelledError("interrupted");
    // Silent from the start: frozen, or not a controller that answers.
    if (guard.unanswered() && !ever_connected) return NoAnswer();

    // The stream ended early. A controller that restarts (it keeps its jobs
    // in its store) is worth waiting for; anything else is the answer. Its
    // graceful shutdown ends the stream CANCELLED: not ours (that is
    // `stopped`), so no interrupt either.
    const bool retry = ever_connected &&
                       (status.ok() || guard.unanswered() ||
                        status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                        status.error_code() == grpc::StatusCode::CANCELLED);
    if (!retry) {
      if (status.ok()) {
        return absl::UnavailableError(
            absl::StrCat("the controller at ", address_, " ended the watch of ",
                         job_id, " before it finished"));
      }
      return UserStatus(status, "WatchJob");
    }
    const absl::Time now = absl::Now();
    if (lost_since == absl::InfiniteFuture()) lost_since = now;
    if (now - lost_since > reconnect_for) {
      return absl::UnavailableError(absl::StrCat(
          "lost the controller at ", address_, " for more than ",
          absl::FormatDuration(reconnect_for), " while watching ", job_id));
    }
    for (absl::Time until = now + absl::Seconds(1); absl::Now() < until;) {
      if (stop()) return absl::CancelledError("interrupted");
      absl::SleepFor(kPoll);
    }
  }
}

}  // namespace gpipe::cli
