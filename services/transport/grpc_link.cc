#include "services/transport/grpc_link.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "services/core/log.h"
#include "services/core/status.h"
#include "services/transport/exchange_method.h"
#include "services/transport/shm_messages.h"

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

// A nonce no other segment is likely to hold (never 0: 0 is "unanswered").
uint64_t NewNonce() {
  std::random_device rd;
  uint64_t n = 0;
  while (n == 0) n = (uint64_t{rd()} << 32) ^ rd();
  return n;
}

}  // namespace

GrpcClientLink::GrpcClientLink(std::unique_ptr<FrameStream> stream,
                               std::string job_id, int64_t epoch,
                               size_t capacity, FrameCodec codec)
    : link_(std::make_unique<GrpcLink>(std::move(stream), std::move(job_id),
                                       epoch, capacity, codec)) {
  reader_ = std::thread([this] { link_->ReadLoop(/*cancel_on_reject=*/true); });
}

GrpcClientLink::~GrpcClientLink() {
  if (!aborted_) link_->HalfClose();
  reader_.join();
  link_->FinishStream();
  link_->Release();
}

void GrpcClientLink::Close() {
  aborted_ = true;
  link_->Close();
}

GrpcLink::GrpcLink(std::unique_ptr<FrameStream> stream, std::string job_id,
                   int64_t epoch, size_t capacity, FrameCodec codec)
    : stream_(std::move(stream)),
      job_id_(std::move(job_id)),
      epoch_(epoch),
      codec_(codec),
      inbox_(capacity) {}

GrpcLink::~GrpcLink() {
  StopShmReader(absl::CancelledError("link destroyed"), /*drain=*/false);
}

bool GrpcLink::WriteLocked(const grpc::ByteBuffer& frame) {
  std::lock_guard<std::mutex> lock(write_mu_);
  return stream_->Write(frame);
}

absl::Status GrpcLink::Send(Message m) {
  std::lock_guard<std::mutex> send_lock(send_mu_);
  ShmChannel* shm = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    plane_cv_.wait(lock, [&] { return !awaiting_answer_ || closed_; });
    if (!plane_status_.ok()) return plane_status_;
    if (plane_ == DataPlane::kShm) shm = shm_.get();
  }
  const int64_t bytes = m.tensor.defined() ? m.tensor.nbytes() : 0;
  absl::Status failed;
  bool ok;
  if (shm != nullptr) {
    failed = WriteShmMessage(m, job_id_, epoch_, *shm);
    ok = failed.ok();
  } else {
    std::lock_guard<std::mutex> lock(write_mu_);
    ok = WriteFrames(
        m, job_id_, epoch_, codec_,
        [this](const grpc::ByteBuffer& b) { return stream_->Write(b); });
  }
  if (!ok) {
    absl::Status why = read_status();
    if (!why.ok()) return why;
    if (!failed.ok() && !absl::IsUnavailable(failed) &&
        !absl::IsCancelled(failed)) {
      return failed;
    }
    return absl::UnavailableError(
        absl::StrCat("sending ", Describe(m), ": the peer went away"));
  }
  sent_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<Message> GrpcLink::Receive() {
  absl::StatusOr<Message> m = inbox_.Pop();
  if (m.ok() && m->tensor.defined()) received_ += m->tensor.nbytes();
  return m;
}

void GrpcLink::Close() {
  {
    // A link that rejected a frame keeps its stream, so the server's handler
    // can still answer the peer with the reason instead of a bare CANCELLED.
    // Once released, the server's handler may have returned and its call be
    // gone; holding mu_ keeps WaitReleased from returning while we cancel.
    std::lock_guard<std::mutex> lock(mu_);
    if (read_status_.ok() && !released_) stream_->Cancel();
    closed_ = true;
    plane_cv_.notify_all();
    if (shm_ != nullptr) {
      shm_->Close(absl::CancelledError("link closed"), /*drain=*/false);
    }
  }
  inbox_.Close(absl::CancelledError("link closed"));
}

void GrpcLink::FinishStream() { stream_->Finish(); }

void GrpcLink::HalfClose() {
  std::lock_guard<std::mutex> lock(write_mu_);
  stream_->WritesDone();
}

void GrpcLink::set_data_plane(const DataPlaneOptions& options) {
  options_ = options;
}

absl::Status GrpcLink::OfferDataPlane(const DataPlaneOptions& options,
                                      int64_t from_stage) {
  options_ = options;
  if (options.mode == DataPlaneMode::kGrpc) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDataPlaneOptions(options));
  const uint64_t nonce = NewNonce();
  absl::StatusOr<std::unique_ptr<ShmSegment>> segment =
      ShmSegment::Create(options.ring_bytes, nonce);
  if (!segment.ok()) {
    if (options.mode == DataPlaneMode::kShm) {
      return absl::FailedPreconditionError(
          absl::StrCat("--data_plane shm: ", segment.status().message()));
    }
    std::lock_guard<std::mutex> lock(mu_);
    refusal_ = std::string(segment.status().message());
    return absl::OkStatus();
  }
  Frame offer;
  offer.set_job_id(job_id_);
  offer.set_epoch(epoch_);
  offer.set_kind(gpipe::v1::DATA_PLANE_OFFER);
  offer.set_from_stage(from_stage);
  gpipe::v1::ShmOffer* o = offer.mutable_shm_offer();
  const HostIdentity host = ThisHost();
  o->set_pid(getpid());
  o->set_fd((*segment)->fd());
  o->set_segment_bytes(ShmSegmentBytes(options.ring_bytes));
  o->set_ring_bytes(options.ring_bytes);
  o->set_nonce(nonce);
  o->set_boot_id(host.boot_id);
  o->set_ipc_namespace(host.ipc_namespace);
  {
    std::lock_guard<std::mutex> lock(mu_);
    offered_ = *std::move(segment);
    awaiting_answer_ = true;
  }
  if (!WriteLocked(FrameToBuffer(offer))) {
    return absl::UnavailableError(
        "the next stage closed the link before the data-plane offer");
  }
  return absl::OkStatus();
}

absl::StatusOr<DataPlane> GrpcLink::WaitDataPlane(
    std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!plane_cv_.wait_for(lock, timeout,
                          [&] { return !awaiting_answer_ || closed_; })) {
    return absl::DeadlineExceededError(
        "the next stage has not answered the data-plane offer yet");
  }
  if (!plane_status_.ok()) return plane_status_;
  if (awaiting_answer_) {
    return read_status_.ok()
               ? absl::UnavailableError(
                     "the next stage closed the link before answering the "
                     "data-plane offer")
               : read_status_;
  }
  return plane_;
}

std::string GrpcLink::data_plane_refusal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refusal_;
}

// The downstream end maps the offered segment when its mode allows and
// the offer is from this host, then answers either way.
absl::Status GrpcLink::HandleOffer(const Frame& f) {
  if (f.job_id() != job_id_ || f.epoch() != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data-plane offer of job '", f.job_id(), "' epoch ", f.epoch(),
        " on a link of job '", job_id_, "' epoch ", epoch_, ": rejected"));
  }
  if (offer_seen_ || offered_ != nullptr) {
    return absl::InvalidArgumentError(
        "frame: a second data-plane offer, or one from the downstream end");
  }
  offer_seen_ = true;
  const gpipe::v1::ShmOffer& o = f.shm_offer();
  std::string refusal =
      options_.mode == DataPlaneMode::kGrpc
          ? "this worker runs --data_plane grpc"
          : (f.has_shm_offer() ? OfferMismatch(o, ThisHost())
                               : std::string("no segment was offered"));
  std::unique_ptr<ShmSegment> segment;
  const uint64_t answer_nonce = NewNonce();
  if (refusal.empty()) {
    absl::StatusOr<std::unique_ptr<ShmSegment>> mapped = ShmSegment::OpenPeer(
        o.pid(), o.fd(), o.ring_bytes(), o.nonce(), answer_nonce);
    if (mapped.ok()) {
      segment = *std::move(mapped);
    } else {
      refusal = std::string(mapped.status().message());
    }
  }
  Frame answer;
  answer.set_job_id(job_id_);
  answer.set_epoch(epoch_);
  answer.set_kind(gpipe::v1::DATA_PLANE_ANSWER);
  answer.set_data_plane(segment != nullptr ? "shm" : "grpc");
  if (segment != nullptr) answer.set_answer_nonce(answer_nonce);
  answer.set_refusal(refusal);
  if (segment != nullptr) {
    const int64_t chunk =
        std::min(options_.chunk_bytes, segment->ring_bytes() / 2);
    std::lock_guard<std::mutex> lock(mu_);
    UseShmLocked(std::make_shared<ShmChannel>(std::move(segment),
                                              /*creator=*/false, chunk));
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    refusal_ = refusal;
  }
  if (!WriteLocked(FrameToBuffer(answer))) {
    return absl::UnavailableError("the upstream stage went away");
  }
  LogInfo("link of %s epoch %d from stage %d: data plane %s%s", job_id_, epoch_,
          f.from_stage(), answer.data_plane(),
          refusal.empty() ? std::string() : absl::StrCat(" (", refusal, ")"));
  if (plane_ != DataPlane::kShm && options_.mode == DataPlaneMode::kShm) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data_plane shm: cannot map the upstream stage's segment: ",
        refusal));
  }
  return absl::OkStatus();
}

absl::Status GrpcLink::HandleAnswer(const Frame& f) {
  if (f.job_id() != job_id_ || f.epoch() != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data-plane answer of job '", f.job_id(), "' epoch ", f.epoch(),
        " on a link of job '", job_id_, "' epoch ", epoch_, ": rejected"));
  }
  if (offered_ == nullptr) {
    return absl::InvalidArgumentError("frame: a data-plane answer to no offer");
  }
  std::string refusal = f.refusal();
  std::shared_ptr<ShmChannel> channel;
  if (f.data_plane() == "shm") {
    if (offered_->answer_nonce() != f.answer_nonce() || f.answer_nonce() == 0) {
      refusal = "the peer's answer is not in the segment (another host?)";
    } else {
      offered_->CloseFd();
      const int64_t chunk =
          std::min(options_.chunk_bytes, offered_->ring_bytes() / 2);
      channel = std::make_shared<ShmChannel>(std::move(offered_),
                                             /*creator=*/true, chunk);
    }
  } else if (refusal.empty()) {
    refusal = absl::StrCat("the peer answered '", f.data_plane(), "'");
  }
  offered_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  if (channel != nullptr) {
    UseShmLocked(std::move(channel));
  } else {
    refusal_ = refusal;
    if (options_.mode == DataPlaneMode::kShm) {
      plane_status_ = absl::FailedPreconditionError(absl::StrCat(
          "--data_plane shm: the next stage cannot share memory with this "
          "one: ",
          refusal));
    }
  }
  awaiting_answer_ = false;
  plane_cv_.notify_all();
  return absl::OkStatus();
}

void GrpcLink::UseShmLocked(std::shared_ptr<ShmChannel> channel) {
  shm_ = std::move(channel);
  plane_ = DataPlane::kShm;
  shm_reader_ = std::thread([this, shm = shm_] { ShmReadLoop(shm); });
}

void GrpcLink::ShmReadLoop(std::shared_ptr<ShmChannel> shm) {
  FrameAssembler assembler(job_id_, epoch_);
  absl::Status rejected;
  for (;;) {
    absl::StatusOr<std::optional<ShmChunk>> chunk = shm->Next();
    if (!chunk.ok()) {
      rejected = chunk.status();  // a chunk that failed a check
      break;
    }
    if (!chunk->has_value()) break;  // closed: the stream or Close says why
    absl::StatusOr<std::optional<Message>> m =
        ReadShmChunk(shm, **chunk, assembler);
    if (!m.ok()) {
      rejected = m.status();
      break;
    }
    if (m->has_value() && !inbox_.Push(std::move(**m)).ok()) break;
  }
  if (rejected.ok()) return;
  // Fail the link at once: the stage's Receive and Send see the reason;
  // the stream's reader returns it (the client end cancels the stream, the
  // server's handler answers with it once the peer stops).
  shm->Close(rejected, /*drain=*/false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shm_failure_.ok()) shm_failure_ = rejected;
    if (cancel_on_reject_ && read_status_.ok() && !released_) {
      stream_->Cancel();
    }
  }
  inbox_.Close(rejected);
}

void GrpcLink::StopShmReader(const absl::Status& why, bool drain) {
  std::shared_ptr<ShmChannel> shm;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shm = shm_;
  }
  if (shm == nullptr) return;
  shm->Close(why, drain);
  if (shm_reader_.joinable() &&
      shm_reader_.get_id() != std::this_thread::get_id()) {
    shm_reader_.join();
  }
}

void GrpcLink::ReadLoop(bool cancel_on_reject) {
  FrameAssembler assembler(job_id_, epoch_);
  grpc::ByteBuffer buffer;
  ReceivedFrame frame;
  absl::Status status;
  cancel_on_reject_ = cancel_on_reject;
  while (stream_->Read(&buffer)) {
    const absl::Status decoded = codec_ == FrameCodec::kCopying
                                     ? DecodeFrameCopying(buffer, &frame)
                                     : DecodeFrame(buffer, &frame);
    absl::StatusOr<std::optional<Message>> m = std::optional<Message>();
    const Frame& f = frame.fields();
    if (!decoded.ok()) {
      m = decoded;
    } else if (f.kind() == gpipe::v1::DATA_PLANE_OFFER) {
      if (absl::Status s = HandleOffer(f); !s.ok()) m = s;
    } else if (f.kind() == gpipe::v1::DATA_PLANE_ANSWER) {
      if (absl::Status s = HandleAnswer(f); !s.ok()) m = s;
    } else if (f.job_id() != job_id_ || f.epoch() != epoch_) {
      m = assembler.Add(frame);  // fencing names the job and epoch
    } else if (f.kind() == gpipe::v1::SHM_RELEASE || f.has_shm_slot()) {
      // Chunks and their releases travel in the segment itself.
      m = absl::InvalidArgumentError(
          "frame: a shared-memory descriptor or release in a frame (they "
          "travel in the segment)");
    } else if (shm_ != nullptr) {
      // Once shared memory carries the peer's messages, a message in a
      // frame could overtake them.
      m = absl::InvalidArgumentError(
          "frame: a message in a frame on a link whose messages travel in "
          "shared memory");
    } else if (options_.mode == DataPlaneMode::kShm && offered_ == nullptr &&
               shm_ == nullptr && !offer_seen_) {
      m = absl::FailedPreconditionError(
          "--data_plane shm: the upstream stage sends frames without offering "
          "shared memory");
    } else {
      m = assembler.Add(frame);
    }
    if (!m.ok()) {
      status = m.status();
      if (absl::IsUnavailable(status)) {
        status = absl::OkStatus();  // the peer went away: not a rejection
        break;
      }
      if (cancel_on_reject) stream_->Cancel();
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
  StopShmReader(status.ok() ? absl::UnavailableError(
                                  "the neighbouring stage closed the link")
                            : status,
                /*drain=*/status.ok());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (status.ok() && !shm_failure_.ok()) status = shm_failure_;
  }
  const absl::Status why =
      status.ok()
          ? absl::UnavailableError("the neighbouring stage closed the link")
          : status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    read_status_ = status;
    closed_ = true;
    plane_cv_.notify_all();
  }
  inbox_.Close(why);
}

absl::Status GrpcLink::read_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return read_status_;
}

void GrpcLink::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  released_ = true;
  released_cv_.notify_all();
}

void GrpcLink::WaitReleased() {
  std::unique_lock<std::mutex> lock(mu_);
  released_cv_.wait(lock, [&] { return released_; });
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

absl::StatusOr<std::unique_ptr<GrpcClientLink>> ConnectDownstream(
    const std::string& address, const std::string& job_id, int64_t epoch,
    int64_t from_stage, size_t capacity, int64_t deadline_ms, FrameCodec codec,
    const DataPlaneOptions& data_plane,
    const ExchangeCredentials& credentials) {
  grpc::ChannelArguments args = KeepaliveChannelArguments();
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
  if (!rw->Write(FrameToBuffer(open))) {
    grpc::Status s = rw->Finish();
    return absl::UnavailableError(
        absl::StrCat("the next stage at ", address,
                     " refused the link: ", s.error_message()));
  }
  auto link = std::make_unique<GrpcClientLink>(
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
