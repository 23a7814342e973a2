// The worker's side of Attach: one bidirectional stream to the controller
// for the worker's whole life. Sends hello, heartbeats and the executor's
// reports; receives assignments and cancellations. Reconnects with
// exponential backoff when the controller is not up yet or goes away.
// Leave() is the drain on SIGTERM: a Goodbye tells the controller to count
// the worker's stage as lost at once rather than when its lease runs out.
#ifndef GPIPE_WORKER_AGENT_H_
#define GPIPE_WORKER_AGENT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "gpipe/v1/controller.grpc.pb.h"
#include "services/security/client_security.h"
#include "worker/executor.h"

namespace gpipe {

class Agent {
 public:
  // `on_attached(true)` runs when the controller's Welcome arrives,
  // `on_attached(false)` when that session ends (readiness follows it).
  // `security`: TLS and the worker token for Attach (default: plaintext,
  // no token).
  Agent(std::string controller_address, gpipe::v1::WorkerHello hello,
        std::function<void(bool)> on_attached = nullptr,
        security::ClientSecurity security = {});

  // Attaches and serves until Stop(); `executor` runs the assignments.
  void Run(Executor* executor);
  void Stop();
  // Says goodbye (with `reason`) if attached, waits up to `grace` for the
  // controller to end the stream, then stops as Stop() does.
  void Leave(const std::string& reason, std::chrono::milliseconds grace);
  // Sends a report if attached (dropped otherwise: the controller treats a
  // detached worker's stage as lost anyway).
  void Report(const gpipe::v1::WorkerMessage& m);
  bool attached() const { return attached_.load(); }

 private:
  // One Attach session; returns when the stream ends.
  void Session(Executor* executor);

  const std::string address_;
  const gpipe::v1::WorkerHello hello_;
  const std::function<void(bool)> on_attached_;
  const security::ClientSecurity security_;
  // Why the last attempt to attach failed, logged once until it changes, so
  // a refused token says so without a line every backoff.
  std::string last_refusal_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> attached_{false};
  std::mutex mu_;  // guards the stream pointers and writes
  std::condition_variable session_ended_;  // stream_ went back to null
  grpc::ClientContext* context_ = nullptr;
  grpc::ClientReaderWriter<gpipe::v1::WorkerMessage,
                           gpipe::v1::ControllerMessage>* stream_ = nullptr;
};

}  // namespace gpipe

#endif  // GPIPE_WORKER_AGENT_H_
