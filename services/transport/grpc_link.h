// A Link over one Exchange stream between neighbouring worker processes.
// The upstream stage is the gRPC client (it opens the stream), the
// downstream stage the server; both ends look the same to the stage runtime.
// A reader drains the stream into a bounded queue, so a stage that is busy
// sending never stops the other direction (HTTP/2 flow control would
// otherwise deadlock two stages that both write), and a full queue pushes
// back on the sender through gRPC's flow control.
#ifndef GPIPE_SERVICES_TRANSPORT_GRPC_LINK_H_
#define GPIPE_SERVICES_TRANSPORT_GRPC_LINK_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "services/transport/frame_codec.h"
#include "services/transport/frame_wire.h"
#include "services/transport/link.h"
#include "services/transport/message_queue.h"

namespace gpipe {

// The two kinds of gRPC stream behind a link: each message is one
// serialized gpipe.v1.Frame (see frame_wire.h).
class FrameStream {
 public:
  virtual ~FrameStream() = default;
  virtual bool Read(grpc::ByteBuffer* frame) = 0;
  virtual bool Write(const grpc::ByteBuffer& frame) = 0;
  // Makes pending and future Read/Write calls fail.
  virtual void Cancel() = 0;
};

class GrpcLink final : public Link {
 public:
  GrpcLink(std::unique_ptr<FrameStream> stream, std::string job_id,
           int64_t epoch, size_t capacity,
           FrameCodec codec = FrameCodec::kZeroCopy);
  ~GrpcLink() override;

  absl::Status Send(Message message) override;
  absl::StatusOr<Message> Receive() override;
  // Aborts: cancels the stream and wakes everything blocked on it. Safe
  // after Release() (then the stream is left alone: it may be gone).
  void Close() override;
  int64_t bytes_sent() const override { return sent_.load(); }
  int64_t bytes_received() const override { return received_.load(); }

  // Reads frames into the queue until the stream ends or fails, or a frame
  // is rejected (then the queue is closed with the reason). Runs on the
  // server's handler thread, which returns the reason as the RPC's status,
  // or on the client's reader thread, which cancels the stream instead
  // (`cancel_on_reject`).
  void ReadLoop(bool cancel_on_reject);
  // Why reading stopped (OK when the peer finished normally).
  absl::Status read_status() const;

  // The stage is done with this link (normally or not): the server's
  // handler may return once this is called.
  void Release();
  void WaitReleased();

 private:
  std::unique_ptr<FrameStream> stream_;
  std::string job_id_;
  int64_t epoch_;
  FrameCodec codec_;
  MessageQueue inbox_;
  std::mutex write_mu_;
  mutable std::mutex mu_;
  std::condition_variable released_cv_;
  bool released_ = false;
  absl::Status read_status_;
  std::atomic<int64_t> sent_{0}, received_{0};
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
absl::StatusOr<std::unique_ptr<Link>> ConnectDownstream(
    const std::string& address, const std::string& job_id, int64_t epoch,
    int64_t from_stage, size_t capacity, int64_t deadline_ms,
    FrameCodec codec = FrameCodec::kZeroCopy,
    const ExchangeCredentials& credentials = {});

// Channel arguments that make a dead peer noticed within seconds.
grpc::ChannelArguments KeepaliveChannelArguments();

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_GRPC_LINK_H_
