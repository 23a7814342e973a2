#include "worker/agent.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <thread>

#include "grpcpp/grpcpp.h"
#include "services/core/log.h"
#include "services/transport/exchange_link.h"

namespace gpipe {

Agent::Agent(std::string controller_address, gpipe::v1::WorkerHello hello,
             std::function<void(bool)> on_attached,
             security::ClientSecurity security)
    : address_(std::move(controller_address)),
      hello_(std::move(hello)),
      on_attached_(std::move(on_attached)),
      security_(std::move(security)) {}

void Agent::Stop() {
  stopping_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (context_ != nullptr) context_->TryCancel();
}

void Agent::Leave(const std::string& reason, std::chrono::milliseconds grace) {
  stopping_ = true;
  std::unique_lock<std::mutex> lock(mu_);
  if (stream_ != nullptr && attached_) {
    gpipe::v1::WorkerMessage bye;
    bye.mutable_goodbye()->set_reason(reason);
    // The controller ends the stream when it reads the goodbye; cancelling
    // before that could drop the goodbye on the wire.
    if (stream_->Write(bye)) {
      LogInfo("said goodbye to the controller (%s)", reason);
      session_ended_.wait_for(lock, grace, [&] { return stream_ == nullptr; });
    }
  }
  if (context_ != nullptr) context_->TryCancel();
}

void Agent::Report(const gpipe::v1::WorkerMessage& m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stream_ != nullptr) stream_->Write(m);
}

void Agent::Run(Executor* executor) {
  auto backoff = std::chrono::milliseconds(100);
  while (!stopping_) {
    const auto start = std::chrono::steady_clock::now();
    Session(executor);
    if (stopping_) break;
    // A session that lasted a while was a real attachment: start over.
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(10))
      backoff = std::chrono::milliseconds(100);
    for (auto waited = std::chrono::milliseconds(0);
         waited < backoff && !stopping_;
         waited += std::chrono::milliseconds(50))
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    backoff = std::min<std::chrono::milliseconds>(backoff * 2,
                                                  std::chrono::seconds(5));
  }
}

void Agent::Session(Executor* executor) {
  grpc::ChannelArguments args = KeepaliveChannelArguments();
  security_.ApplyTo(args);
  auto channel =
      grpc::CreateCustomChannel(address_, security_.Credentials(), args);
  auto stub = gpipe::v1::Controller::NewStub(channel);
  grpc::ClientContext context;
  security_.ApplyTo(&context);
  auto stream = stub->Attach(&context);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    context_ = &context;
    stream_ = stream.get();
  }
  gpipe::v1::WorkerMessage hello;
  *hello.mutable_hello() = hello_;
  gpipe::v1::ControllerMessage in;
  bool ok = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ok = stream->Write(hello);
  }
  // Whether the stream is still open (else Finish has the server's reason,
  // e.g. a refused token, which cancelling would hide).
  bool open = ok;
  if (ok) {
    open = stream->Read(&in);
    ok = open && in.has_welcome();
  }
  std::mutex beat_mu;
  std::condition_variable beat_cv;
  bool done = false;
  std::thread heartbeat;
  if (ok) {
    attached_ = true;
    if (on_attached_) on_attached_(true);
    LogInfo("attached to the controller at %s as %s; stages reach it at %s",
            address_, hello_.worker_id(), in.welcome().address());
    const auto interval = std::chrono::milliseconds(
        std::max<int64_t>(50, in.welcome().heartbeat_interval_ms()));
    heartbeat = std::thread([&] {
      gpipe::v1::WorkerMessage beat;
      beat.mutable_heartbeat();
      std::unique_lock<std::mutex> lock(beat_mu);
      while (!beat_cv.wait_for(lock, interval, [&] { return done; }))
        Report(beat);
    });
    while (stream->Read(&in)) {
      if (in.has_assignment()) {
        executor->Start(in.assignment());
      } else if (in.has_cancel()) {
        executor->Cancel(in.cancel().job_id(), in.cancel().epoch());
      } else if (in.has_cut_bubble()) {
        executor->SetCutBubble(in.cut_bubble().job_id(),
                               in.cut_bubble().epoch(),
                               in.cut_bubble().predicted_bubble());
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(beat_mu);
    done = true;
  }
  beat_cv.notify_all();
  if (heartbeat.joinable()) heartbeat.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    context_ = nullptr;
    stream_ = nullptr;
  }
  session_ended_.notify_all();
  const bool was_attached = attached_.exchange(false);
  if (was_attached && on_attached_) on_attached_(false);
  if (open) context.TryCancel();
  grpc::Status status = stream->Finish();
  // The controller counts this worker's stage as lost; drop it here too so
  // the worker comes back clean.
  executor->CancelAll();
  if (was_attached && !stopping_) {
    LogWarning("lost the controller at %s (%s); reattaching", address_,
               status.error_message());
    last_refusal_.clear();
  } else if (!was_attached && !stopping_ && !status.ok() &&
             status.error_message() != last_refusal_) {
    // Refused (a token, a certificate) or unreachable: say why once.
    last_refusal_ = status.error_message();
    LogWarning("cannot attach to the controller at %s (%s): %s; retrying",
               address_,
               grpc::StatusCode(status.error_code()) ==
                       grpc::StatusCode::UNAUTHENTICATED
                   ? "UNAUTHENTICATED: check --token_file"
                   : "check --controller and the --tls_* flags",
               status.error_message());
  }
}

}  // namespace gpipe
