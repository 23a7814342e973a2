// A worker process as the controller sees it, for tests of the controller
// over real gRPC: one Attach stream, messages read on a thread into a queue
// so the test can wait with a timeout; hello, heartbeats and progress sent
// on demand, and a Break() that looks like the process dying.
#ifndef GPIPE_TESTS_SUPPORT_FAKE_WORKER_H_
#define GPIPE_TESTS_SUPPORT_FAKE_WORKER_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gpipe/v1/controller.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace gpipe::test_support {

inline constexpr absl::Duration kFakeWorkerWait = absl::Seconds(5);

class FakeWorker {
 public:
  FakeWorker(gpipe::v1::Controller::Stub& stub, std::string id,
             std::string address)
      : id_(std::move(id)), address_(std::move(address)) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(60));
    stream_ = stub.Attach(&context_);
    reader_ = std::thread([this] {
      gpipe::v1::ControllerMessage message;
      while (stream_->Read(&message)) {
        std::lock_guard<std::mutex> lock(mu_);
        inbox_.push_back(message);
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      cv_.notify_all();
    });
  }

  ~FakeWorker() {
    StopHeartbeats();
    context_.TryCancel();
    reader_.join();
    if (!finished_) stream_->Finish();
  }

  const std::string& id() const { return id_; }
  const std::string& address() const { return address_; }

  bool Send(const gpipe::v1::WorkerMessage& message) {
    std::lock_guard<std::mutex> lock(write_mu_);
    return stream_->Write(message);
  }

  // Hello (with `session_key`, WorkerHello.session_key), then the Welcome.
  void Attach(const std::string& session_key = "") {
    gpipe::v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(id_);
    hello.mutable_hello()->set_session_key(session_key);
    hello.mutable_hello()->set_address(address_);
    hello.mutable_hello()->mutable_resources()->set_cpus(2);
    ASSERT_TRUE(Send(hello));
    std::optional<gpipe::v1::ControllerMessage> welcome = Next();
    ASSERT_TRUE(welcome.has_value()) << id_ << " got no welcome";
    ASSERT_TRUE(welcome->has_welcome()) << welcome->DebugString();
    EXPECT_GT(welcome->welcome().heartbeat_interval_ms(), 0);
    welcome_ = welcome->welcome();
  }
  // What Attach() received.
  const gpipe::v1::Welcome& welcome() const { return welcome_; }

  // The next message from the controller, or nullopt after `timeout` or
  // when the stream has ended.
  std::optional<gpipe::v1::ControllerMessage> Next(
      absl::Duration timeout = kFakeWorkerWait) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                 [&] { return !inbox_.empty() || closed_; });
    if (inbox_.empty()) return std::nullopt;
    gpipe::v1::ControllerMessage message = std::move(inbox_.front());
    inbox_.pop_front();
    return message;
  }

  gpipe::v1::Assignment NextAssignment() {
    std::optional<gpipe::v1::ControllerMessage> m = Next();
    EXPECT_TRUE(m.has_value() && m->has_assignment())
        << id_ << ": expected an assignment, got "
        << (m ? m->DebugString() : "nothing");
    return m && m->has_assignment() ? m->assignment() : gpipe::v1::Assignment();
  }

  gpipe::v1::CancelAssignment NextCancel() {
    std::optional<gpipe::v1::ControllerMessage> m = Next();
    EXPECT_TRUE(m.has_value() && m->has_cancel())
        << id_ << ": expected a cancel, got "
        << (m ? m->DebugString() : "nothing");
    return m && m->has_cancel() ? m->cancel() : gpipe::v1::CancelAssignment();
  }

  // Waits for the controller to end the stream; its status.
  grpc::Status WaitClosed(absl::Duration timeout = kFakeWorkerWait) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                        [&] { return closed_; })) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            "the stream did not end");
      }
    }
    finished_ = true;
    return stream_->Finish();
  }

  // The stream breaks as if the process died.
  void Break() { context_.TryCancel(); }

  void StartHeartbeats(absl::Duration interval) {
    heartbeat_ = std::thread([this, interval] {
      gpipe::v1::WorkerMessage beat;
      beat.mutable_heartbeat();
      while (!stop_heartbeats_) {
        Send(beat);
        absl::SleepFor(interval);
      }
    });
  }
  void StopHeartbeats() {
    stop_heartbeats_ = true;
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  bool Progress(const gpipe::v1::Assignment& a, int64_t step, double loss = 0,
                double step_seconds = 0) {
    gpipe::v1::WorkerMessage m;
    gpipe::v1::StepProgress& p = *m.mutable_progress();
    p.set_job_id(a.job_id());
    p.set_epoch(a.epoch());
    p.set_stage(a.stage());
    p.set_step(step);
    p.set_loss(loss);
    p.set_step_seconds(step_seconds);
    return Send(m);
  }

 private:
  const std::string id_;
  const std::string address_;
  gpipe::v1::Welcome welcome_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<gpipe::v1::WorkerMessage,
                                           gpipe::v1::ControllerMessage>>
      stream_;
  std::mutex write_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<gpipe::v1::ControllerMessage> inbox_;
  bool closed_ = false;
  bool finished_ = false;
  std::thread reader_;
  std::thread heartbeat_;
  std::atomic<bool> stop_heartbeats_{false};
};

}  // namespace gpipe::test_support

#endif  // GPIPE_TESTS_SUPPORT_FAKE_WORKER_H_
