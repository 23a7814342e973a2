// A Link over one Exchange stream between neighbouring worker processes.
// The upstream stage is the gRPC client (it opens the stream), the
// downstream stage the server; both ends look the same to the stage runtime.
// The stream is the control path (control_stream.h); the tensors travel on
// the data plane the two ends agree on (plane_negotiator.h): frames on the
// stream itself, a shared-memory segment, or a CUDA IPC device buffer
// (plane.h). A reader drains the stream into a bounded queue, so a stage
// that is busy sending never stops the other direction (HTTP/2 flow control
// would otherwise deadlock two stages that both write), and a full queue
// pushes back on the sender through gRPC's flow control.
#ifndef GPIPE_SERVICES_TRANSPORT_EXCHANGE_LINK_H_
#define GPIPE_SERVICES_TRANSPORT_EXCHANGE_LINK_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "services/transport/control_stream.h"
#include "services/transport/data_plane.h"
#include "services/transport/frame_data_plane.h"
#include "services/transport/frame_wire.h"
#include "services/transport/link.h"
#include "services/transport/message_queue.h"
#include "services/transport/plane.h"
#include "services/transport/plane_negotiator.h"

namespace gpipe {

class ExchangeLink final : public Link {
 public:
  ExchangeLink(std::unique_ptr<FrameStream> stream, std::string job_id,
               int64_t epoch, size_t capacity,
               FrameCodec codec = FrameCodec::kZeroCopy);
  ~ExchangeLink() override;

  absl::Status Send(Message message) override ABSL_LOCKS_EXCLUDED(send_mu_);
  absl::StatusOr<Message> Receive() override;
  // Aborts: cancels the stream and wakes everything blocked on it. Safe
  // after Release() (then the stream is left alone: it may be gone).
  void Close() override ABSL_LOCKS_EXCLUDED(mu_);
  int64_t bytes_sent() const override { return sent_.load(); }
  int64_t bytes_received() const override { return received_.load(); }
  // True on the CUDA IPC plane (waiting for the peer's answer first, as
  // Send does).
  bool CarriesDeviceTensors() override {
    return negotiator_.CarriesDeviceTensors();
  }
  int64_t mapped_bytes() const override { return negotiator_.mapped_bytes(); }
  // The stage is done with this link (normally or not): the server's
  // handler may return once this is called.
  void Release() override ABSL_LOCKS_EXCLUDED(mu_);

  // Reads frames until the stream ends or fails, or a frame is rejected
  // (then the inbox is closed with the reason). Runs on the server's
  // handler thread, which returns the reason as the RPC's status, or on
  // the client's reader thread, which cancels the stream instead
  // (`cancel_on_reject`).
  void ReadLoop(bool cancel_on_reject) ABSL_LOCKS_EXCLUDED(mu_);
  // Why reading stopped (OK when the peer finished normally).
  absl::Status read_status() const ABSL_LOCKS_EXCLUDED(mu_);
  void WaitReleased() ABSL_LOCKS_EXCLUDED(mu_);
  // The client's end: no more writes (after the stage's last Send), then
  // the server's final status once reading ended.
  void HalfClose() { control_.WritesDone(); }
  void FinishStream() { control_.Finish(); }

  // Data planes. The downstream end: what it accepts when offered
  // (default: frames only); before ReadLoop.
  void set_data_plane(const DataPlaneOptions& options) {
    negotiator_.set_options(options);
  }
  // The upstream end, once its reader runs: offers what `options` allow.
  absl::Status OfferDataPlane(const DataPlaneOptions& options,
                              int64_t from_stage) {
    return negotiator_.Offer(options, from_stage);
  }
  // The plane Send uses, waiting up to `timeout` for the peer's answer
  // (DEADLINE_EXCEEDED while none came). A forced plane the peer refused
  // is FAILED_PRECONDITION naming why.
  absl::StatusOr<DataPlaneKind> WaitDataPlane(
      std::chrono::milliseconds timeout) {
    return negotiator_.WaitKind(timeout);
  }
  // Why the faster planes are not used (empty when one is, or none was
  // considered).
  PlaneRefusal refusal() const { return negotiator_.refusal(); }
  std::string data_plane_refusal() const { return refusal().ToString(); }

 private:
  // A plane's own reader found a bad chunk: fail the link with it.
  void OnPlaneFailure(const absl::Status& why) ABSL_LOCKS_EXCLUDED(mu_);

  ControlStream control_;
  const PlaneContext context_;
  MessageQueue inbox_;
  FrameDataPlane frames_;  // every link's first plane
  absl::Mutex send_mu_;    // one Send at a time
  mutable absl::Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool cancel_on_reject_ ABSL_GUARDED_BY(mu_) = false;  // ReadLoop's
  absl::Status read_status_ ABSL_GUARDED_BY(mu_);
  absl::Status plane_failure_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> sent_{0}, received_{0};
  // Last: its planes' threads use everything above until they stop.
  PlaneNegotiator negotiator_;
};

// The upstream end of an Exchange stream: owns the reader thread, and on
// normal destruction half-closes and waits for the peer to finish, so no
// frame in flight is dropped.
class ExchangeClientLink final : public Link {
 public:
  ExchangeClientLink(std::unique_ptr<FrameStream> stream, std::string job_id,
                     int64_t epoch, size_t capacity, FrameCodec codec);
  ~ExchangeClientLink() override;
  absl::Status Send(Message m) override { return link_->Send(std::move(m)); }
  absl::StatusOr<Message> Receive() override { return link_->Receive(); }
  void Close() override;
  int64_t bytes_sent() const override { return link_->bytes_sent(); }
  int64_t bytes_received() const override { return link_->bytes_received(); }
  bool CarriesDeviceTensors() override { return link_->CarriesDeviceTensors(); }
  int64_t mapped_bytes() const override { return link_->mapped_bytes(); }
  ExchangeLink& link() { return *link_; }

 private:
  std::unique_ptr<ExchangeLink> link_;
  std::thread reader_;
  std::atomic<bool> aborted_{false};
};

// The metadata that carries the assignment's stream key on Exchange
// (services/security/stream_key.h).
inline constexpr char kStreamKeyMetadata[] = "x-gpipe-stream-key";

// How an Exchange client proves itself to the downstream stage.
struct ExchangeCredentials {
  std::shared_ptr<grpc::ChannelCredentials> channel;  // null: plaintext
  // The name expected in the peer's certificate instead of the address's
  // host (pod IPs are in no certificate); empty: the host.
  std::string tls_server_name;
  std::string stream_key;  // sent as kStreamKeyMetadata when not empty
};

// Connects to the downstream stage at `address` and opens the job's
// Exchange stream; the returned link's reader runs on its own thread.
// Fails with UNAVAILABLE when the peer cannot be reached by `deadline_ms`.
// `data_plane`: what to offer the peer (ExchangeLink::OfferDataPlane); the
// answer comes later (link().WaitDataPlane). `from_replica`: the caller's
// replica; a caller of the same stage index as the peer opens a gradient
// reduction link between two replicas of that stage.
absl::StatusOr<std::unique_ptr<ExchangeClientLink>> ConnectDownstream(
    const std::string& address, const std::string& job_id, int64_t epoch,
    int64_t from_stage, size_t capacity, int64_t deadline_ms,
    FrameCodec codec = FrameCodec::kZeroCopy,
    const DataPlaneOptions& data_plane = DataPlaneOptions(),
    const ExchangeCredentials& credentials = {}, int64_t from_replica = 0);

// Channel arguments that make a dead peer noticed within seconds.
grpc::ChannelArguments KeepaliveChannelArguments();

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_EXCHANGE_LINK_H_
