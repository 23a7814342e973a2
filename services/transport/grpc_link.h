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
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "services/transport/cuda_ipc_channel.h"
#include "services/transport/data_plane.h"
#include "services/transport/frame_codec.h"
#include "services/transport/frame_wire.h"
#include "services/transport/link.h"
#include "services/transport/message_queue.h"
#include "services/transport/shm_channel.h"

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
  // The client's end: half-close, then wait for the server's status.
  virtual void WritesDone() {}
  virtual void Finish() {}
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
  // True on the CUDA IPC plane (waiting for the peer's answer first, as
  // Send does): Send then takes device tensors as they are and Receive
  // returns device tensors from the calling thread's current allocator.
  bool CarriesDeviceTensors() override;

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
  // The client's end: no more writes (after the stage's last Send), then
  // the server's final status once reading ended.
  void HalfClose();
  void FinishStream();

  // Data planes (data_plane.h). Until a shared-memory segment is agreed on,
  // tensors travel in frames.
  // The downstream end: what it accepts when the upstream stage offers
  // shared memory (default: frames only). Call before ReadLoop.
  void set_data_plane(const DataPlaneOptions& options);
  // The upstream end, once its reader runs: offers a segment when
  // `options` allow it; Send then waits for the answer. Fails only when
  // shared memory is forced and no segment can be made.
  absl::Status OfferDataPlane(const DataPlaneOptions& options,
                              int64_t from_stage);
  // The plane Send uses, waiting up to `timeout` for the peer's answer
  // (DEADLINE_EXCEEDED while none came). Forced shared memory that the
  // peer could not map is FAILED_PRECONDITION naming why.
  absl::StatusOr<DataPlane> WaitDataPlane(std::chrono::milliseconds timeout);
  // Why the faster planes are not used ("" when one is or none was
  // offered), for the log.
  std::string data_plane_refusal() const;

 private:
  bool WriteLocked(const grpc::ByteBuffer& frame);
  absl::Status HandleOffer(const gpipe::v1::Frame& f);
  absl::Status HandleAnswer(const gpipe::v1::Frame& f);
  // Once a segment is agreed on (reader thread, under mu_): makes it the
  // plane and starts the thread that reads the peer's chunks.
  void UseShmLocked(std::shared_ptr<ShmChannel> channel);
  // The peer's messages out of the segment into the inbox, until the
  // channel closes; a chunk that fails a check fails the link.
  void ShmReadLoop(std::shared_ptr<ShmChannel> shm);
  // Ends the shared-memory reader (after what the peer posted when
  // `drain`) and waits for it.
  void StopShmReader(const absl::Status& why, bool drain);
  // The CUDA IPC plane (cuda_ipc_channel.h): descriptors of device chunks
  // in frames, checked by the reader thread; the stage's thread copies the
  // tensor out in Receive and then releases its chunks.
  absl::Status OfferCudaIpc(const DataPlaneOptions& options,
                            gpipe::v1::Frame* offer);
  absl::Status OfferShm(const DataPlaneOptions& options,
                        gpipe::v1::Frame* offer);
  // Opens the offered device buffer ("" when the CUDA IPC plane is now
  // agreed on and its answer is in `answer`), else why not.
  std::string TakeCudaIpcOffer(const gpipe::v1::Frame& f,
                               gpipe::v1::Frame* answer);
  absl::Status SendCudaIpc(const Message& m, CudaIpcChannel* cuda);
  absl::StatusOr<std::optional<Message>> ReceiveCudaIpc(
      const ReceivedFrame& frame);
  absl::Status ReadDeviceTensor(Message& m);
  bool WriteCudaRelease(int64_t sequence);

  std::unique_ptr<FrameStream> stream_;
  std::string job_id_;
  int64_t epoch_;
  FrameCodec codec_;
  MessageQueue inbox_;
  std::mutex send_mu_;   // one Send at a time
  std::mutex write_mu_;  // one stream write at a time (Send, releases)
  mutable std::mutex mu_;
  std::condition_variable released_cv_;
  bool released_ = false;
  absl::Status read_status_;
  std::atomic<int64_t> sent_{0}, received_{0};

  DataPlaneOptions options_;
  std::condition_variable plane_cv_;
  // Under mu_: set by the reader thread, read by Send.
  bool awaiting_answer_ = false;
  bool closed_ = false;
  DataPlane plane_ = DataPlane::kGrpc;
  absl::Status plane_status_;
  std::string refusal_;
  std::shared_ptr<ShmChannel> shm_;  // set once, under mu_
  std::thread shm_reader_;           // reads shm_ (started with it)
  absl::Status shm_failure_;         // under mu_: a chunk that failed a check
  bool cancel_on_reject_ = false;    // ReadLoop's, for the shm reader
  bool offering_end_ = false;        // under mu_: OfferDataPlane was called
  // The reader thread's alone.
  std::unique_ptr<ShmSegment> offered_;
  bool offer_seen_ = false;

  std::unique_ptr<CudaIpcChannel> cuda_;         // set once, under mu_
  std::unique_ptr<CudaIpcBuffer> offered_cuda_;  // the reader thread's
  // A device tensor on its way: its message goes into the inbox (without
  // the tensor) with the first chunk, and Receive copies the chunks out as
  // the reader thread checks them, releasing each, so that a tensor larger
  // than the ring flows through it.
  struct ArrivingTensor {
    Message message;
    Shape shape;
    DType dtype = DType::kF32;
    std::deque<gpipe::v1::ShmSlot> chunks;  // checked, not yet copied
    bool complete = false;                  // no more chunks will come
  };
  std::mutex cuda_mu_;
  std::condition_variable cuda_cv_;
  // Under cuda_mu_: in the order of their messages in the inbox.
  std::deque<std::shared_ptr<ArrivingTensor>> cuda_pending_;
  absl::Status cuda_closed_;                       // why no more chunks come
  std::shared_ptr<ArrivingTensor> cuda_arriving_;  // the reader thread's
};

// The upstream end of an Exchange stream: owns the reader thread, and on
// normal destruction half-closes and waits for the peer to finish, so no
// frame in flight is dropped.
class GrpcClientLink final : public Link {
 public:
  GrpcClientLink(std::unique_ptr<FrameStream> stream, std::string job_id,
                 int64_t epoch, size_t capacity, FrameCodec codec);
  ~GrpcClientLink() override;
  absl::Status Send(Message m) override { return link_->Send(std::move(m)); }
  absl::StatusOr<Message> Receive() override { return link_->Receive(); }
  void Close() override;
  int64_t bytes_sent() const override { return link_->bytes_sent(); }
  int64_t bytes_received() const override { return link_->bytes_received(); }
  bool CarriesDeviceTensors() override { return link_->CarriesDeviceTensors(); }
  GrpcLink& link() { return *link_; }

 private:
  std::unique_ptr<GrpcLink> link_;
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
// `data_plane`: what to offer the peer (GrpcLink::OfferDataPlane); the
// answer comes later (link().WaitDataPlane).
absl::StatusOr<std::unique_ptr<GrpcClientLink>> ConnectDownstream(
    const std::string& address, const std::string& job_id, int64_t epoch,
    int64_t from_stage, size_t capacity, int64_t deadline_ms,
    FrameCodec codec = FrameCodec::kZeroCopy,
    const DataPlaneOptions& data_plane = DataPlaneOptions(),
    const ExchangeCredentials& credentials = {});

// Channel arguments that make a dead peer noticed within seconds.
grpc::ChannelArguments KeepaliveChannelArguments();

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_GRPC_LINK_H_
