#include "services/transport/exchange_link.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "services/tensor/allocator.h"
#include "services/transport/exchange_method.h"
#include "services/transport/frame_codec.h"

namespace gpipe {
namespace {

using gpipe::v1::Frame;

class ClientFrameStream final : public FrameStream {
 public:
  ClientFrameStream(std::shared_ptr<grpc::Channel> channel,
                    std::unique_ptr<grpc::ClientContext> context,
                    std::unique_ptr<ExchangeClientStream> rw)
      : channel_(std::move(channel)),
        context_(std::move(context)),
        rw_(std::move(rw)) {}
  bool Read(grpc::ByteBuffer* b) override { return rw_->Read(b); }
  bool Write(const grpc::ByteBuffer& b) override { return rw_->Write(b); }
  void Cancel() override { context_->TryCancel(); }
  void WritesDone() override { rw_->WritesDone(); }
  void Finish() override { rw_->Finish(); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<ExchangeClientStream> rw_;
};

}  // namespace

ExchangeLink::ExchangeLink(std::unique_ptr<FrameStream> stream,
                           std::string job_id, int64_t epoch, size_t capacity,
                           FrameCodec codec)
    : control_(std::move(stream)),
      context_{std::move(job_id),
               epoch,
               &control_,
               &inbox_,
               codec,
               [this](const absl::Status& why) { OnPlaneFailure(why); }},
      inbox_(capacity),
      frames_(context_),
      negotiator_(context_, &frames_) {}

// The negotiator goes first (it is the last member): the shared-memory
// reader stops before the inbox it fills.
ExchangeLink::~ExchangeLink() = default;

absl::Status ExchangeLink::Send(Message m) {
  absl::MutexLock send_lock(&send_mu_);
  absl::StatusOr<DataPlane*> plane = negotiator_.AwaitPlane();
  if (!plane.ok()) return plane.status();
  const int64_t bytes = m.tensor.defined() ? m.tensor.nbytes() : 0;
  if (absl::Status failed = (*plane)->Send(m); !failed.ok()) {
    if (absl::Status why = read_status(); !why.ok()) return why;
    if (!absl::IsUnavailable(failed) && !absl::IsCancelled(failed)) {
      return failed;
    }
    return absl::UnavailableError(
        absl::StrCat("sending ", Describe(m), ": the peer went away"));
  }
  sent_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<Message> ExchangeLink::Receive() {
  absl::StatusOr<Message> m = inbox_.Pop();
  // Only the CUDA IPC plane queues an activation or gradient without its
  // tensor: frames always carry one.
  if (m.ok() && !m->tensor.defined() &&
      (m->kind == MessageKind::kActivation ||
       m->kind == MessageKind::kGradient)) {
    DataPlane* plane = negotiator_.agreed();
    absl::Status read = plane != nullptr
                            ? plane->ReceiveTensor(*m)
                            : absl::InternalError(absl::StrCat(
                                  Describe(*m), " arrived without its tensor"));
    if (!read.ok()) {
      Close();
      return read;
    }
  }
  if (m.ok() && m->tensor.defined()) {
    // Built on the reader thread (or lent by the shm ring): from here on
    // the receiving stage holds it, and its allocator counts it.
    m->tensor.CountIn(CurrentAllocator(m->tensor.device()));
    received_ += m->tensor.nbytes();
  }
  return m;
}

void ExchangeLink::Close() {
  {
    // A link that rejected a frame keeps its stream, so the server's handler
    // can still answer the peer with the reason instead of a bare CANCELLED.
    // Once released, the server's handler may have returned and its call be
    // gone; holding mu_ keeps WaitReleased from returning while we cancel.
    absl::MutexLock lock(&mu_);
    if (read_status_.ok() && !released_) control_.Cancel();
  }
  const absl::Status closed = absl::CancelledError("link closed");
  negotiator_.Close(closed, absl::OkStatus());
  inbox_.Close(closed);
}

void ExchangeLink::OnPlaneFailure(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    if (plane_failure_.ok()) plane_failure_ = why;
    // The client's end cancels the stream at once; the server's handler
    // answers with the reason once the peer stops.
    if (cancel_on_reject_ && read_status_.ok() && !released_) {
      control_.Cancel();
    }
  }
  inbox_.Close(why);
}

void ExchangeLink::ReadLoop(bool cancel_on_reject) {
  {
    absl::MutexLock lock(&mu_);
    cancel_on_reject_ = cancel_on_reject;
  }
  // Only for its fencing check: frames of another job or epoch.
  FrameAssembler fencing(context_.job_id, context_.epoch);
  grpc::ByteBuffer buffer;
  ReceivedFrame frame;
  absl::Status status;
  while (control_.Read(&buffer)) {
    const absl::Status decoded = context_.codec == FrameCodec::kCopying
                                     ? DecodeFrameCopying(buffer, &frame)
                                     : DecodeFrame(buffer, &frame);
    absl::StatusOr<std::optional<Message>> m = std::optional<Message>();
    const Frame& f = frame.fields();
    if (!decoded.ok()) {
      m = decoded;
    } else if (f.kind() == gpipe::v1::DATA_PLANE_OFFER) {
      if (absl::Status s = negotiator_.HandleOffer(f); !s.ok()) m = s;
    } else if (f.kind() == gpipe::v1::DATA_PLANE_ANSWER) {
      if (absl::Status s = negotiator_.HandleAnswer(f); !s.ok()) m = s;
    } else if (f.job_id() != context_.job_id || f.epoch() != context_.epoch) {
      m = fencing.Add(frame);  // fencing names the job and epoch
    } else if (f.kind() == gpipe::v1::SHM_RELEASE || f.has_shm_slot()) {
      // Chunks and their releases travel in the segment itself.
      m = absl::InvalidArgumentError(
          "frame: a shared-memory descriptor or release in a frame (they "
          "travel in the segment)");
    } else if (DataPlane* plane = negotiator_.agreed(); plane != nullptr) {
      m = plane->OnFrame(frame);
    } else if (f.kind() == gpipe::v1::CUDA_IPC_RELEASE ||
               f.has_cuda_ipc_slot()) {
      m = frames_.OnFrame(frame);  // refused: no CUDA IPC on this link
    } else if (absl::Status s = negotiator_.CheckFramesAllowed(); !s.ok()) {
      m = s;
    } else {
      m = frames_.OnFrame(frame);
    }
    if (!m.ok()) {
      status = m.status();
      if (absl::IsUnavailable(status)) {
        status = absl::OkStatus();  // the peer went away: not a rejection
        break;
      }
      if (cancel_on_reject) control_.Cancel();
      break;
    }
    if (m->has_value()) {
      if (absl::Status pushed = inbox_.Push(std::move(**m)); !pushed.ok()) {
        break;  // closed locally
      }
    }
  }
  // Whatever the peer posted in the segment before it finished comes
  // before the end of the link; a peer that failed or was killed leaves
  // nothing worth reading.
  const absl::Status peer_closed = absl::UnavailableError(
      "the neighbouring stage closed the link or stopped "
      "answering");
  negotiator_.Stop(status.ok() ? peer_closed : status,
                   /*drain=*/status.ok());
  {
    absl::MutexLock lock(&mu_);
    if (status.ok() && !plane_failure_.ok()) status = plane_failure_;
    read_status_ = status;
  }
  const absl::Status why = status.ok() ? peer_closed : status;
  negotiator_.Close(why, status);
  inbox_.Close(why);
}

absl::Status ExchangeLink::read_status() const {
  absl::MutexLock lock(&mu_);
  return read_status_;
}

void ExchangeLink::Release() {
  absl::MutexLock lock(&mu_);
  released_ = true;
}

void ExchangeLink::WaitReleased() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&released_));
}

ExchangeClientLink::ExchangeClientLink(std::unique_ptr<FrameStream> stream,
                                       std::string job_id, int64_t epoch,
                                       size_t capacity, FrameCodec codec)
    : link_(std::make_unique<ExchangeLink>(std::move(stream), std::move(job_id),
                                           epoch, capacity, codec)) {
  reader_ = std::thread([this] { link_->ReadLoop(/*cancel_on_reject=*/true); });
}

ExchangeClientLink::~ExchangeClientLink() {
  if (!aborted_) link_->HalfClose();
  reader_.join();
  link_->FinishStream();
  link_->Release();
}

void ExchangeClientLink::Close() {
  aborted_ = true;
  link_->Close();
}

grpc::ChannelArguments KeepaliveChannelArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(4 * kMaxChunkBytes);
  return args;
}

absl::StatusOr<std::unique_ptr<ExchangeClientLink>> ConnectDownstream(
    const std::string& address, const std::string& job_id, int64_t epoch,
    int64_t from_stage, size_t capacity, int64_t deadline_ms, FrameCodec codec,
    const DataPlaneOptions& data_plane, const ExchangeCredentials& credentials,
    int64_t from_replica) {
  grpc::ChannelArguments args = KeepaliveChannelArguments();
  // A neighbour that is not listening yet is tried again within the
  // attempt, not a second later (gRPC's default first backoff).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (credentials.channel != nullptr && !credentials.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(credentials.tls_server_name);
  }
  auto channel = grpc::CreateCustomChannel(
      address,
      credentials.channel != nullptr ? credentials.channel
                                     : grpc::InsecureChannelCredentials(),
      args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::milliseconds(deadline_ms))) {
    // With TLS a refused handshake looks the same as a peer that is down.
    const std::string tls_hint =
        credentials.channel == nullptr
            ? std::string()
            : absl::StrCat(
                  " (TLS: is its certificate signed by our --tls_ca and "
                  "issued for ",
                  credentials.tls_server_name.empty()
                      ? std::string("its host")
                      : absl::StrCat("\"", credentials.tls_server_name,
                                     "\" (--tls_peer_name)"),
                  "?)");
    return absl::UnavailableError(
        absl::StrCat("cannot reach the next stage at ", address, " within ",
                     deadline_ms, " ms", tls_hint));
  }
  auto context = std::make_unique<grpc::ClientContext>();
  if (!credentials.stream_key.empty()) {
    context->AddMetadata(kStreamKeyMetadata, credentials.stream_key);
  }
  std::unique_ptr<ExchangeClientStream> rw =
      StartExchange(channel.get(), context.get());
  Frame open;
  open.set_job_id(job_id);
  open.set_epoch(epoch);
  open.set_kind(gpipe::v1::OPEN);
  open.set_from_stage(from_stage);
  open.set_from_replica(from_replica);
  if (!rw->Write(FrameToBuffer(open))) {
    grpc::Status s = rw->Finish();
    return absl::UnavailableError(
        absl::StrCat("the next stage at ", address,
                     " refused the link: ", s.error_message()));
  }
  auto link = std::make_unique<ExchangeClientLink>(
      std::make_unique<ClientFrameStream>(std::move(channel),
                                          std::move(context), std::move(rw)),
      job_id, epoch, capacity, codec);
  if (absl::Status offered =
          link->link().OfferDataPlane(data_plane, from_stage);
      !offered.ok()) {
    link->Close();
    return offered;
  }
  return link;
}

}  // namespace gpipe
