#include "services/transport/grpc_link.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "services/core/log.h"
#include "services/core/status.h"
#include "services/tensor/allocator.h"
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
  CudaIpcChannel* cuda = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    plane_cv_.wait(lock, [&] { return !awaiting_answer_ || closed_; });
    if (!plane_status_.ok()) return plane_status_;
    if (plane_ == DataPlane::kShm) shm = shm_.get();
    if (plane_ == DataPlane::kCudaIpc) cuda = cuda_.get();
  }
  const int64_t bytes = m.tensor.defined() ? m.tensor.nbytes() : 0;
  absl::Status failed;
  bool ok;
  if (cuda != nullptr) {
    failed = SendCudaIpc(m, cuda);
    ok = failed.ok();
  } else if (shm != nullptr) {
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
  // Only the CUDA IPC plane queues an activation or gradient without its
  // tensor: frames always carry one.
  if (m.ok() && !m->tensor.defined() &&
      (m->kind == MessageKind::kActivation ||
       m->kind == MessageKind::kGradient)) {
    if (absl::Status read = ReadDeviceTensor(*m); !read.ok()) {
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

bool GrpcLink::CarriesDeviceTensors() {
  std::unique_lock<std::mutex> lock(mu_);
  plane_cv_.wait(lock, [&] { return !awaiting_answer_ || closed_; });
  return plane_ == DataPlane::kCudaIpc;
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
    if (cuda_ != nullptr) cuda_->Close(absl::CancelledError("link closed"));
  }
  {
    std::lock_guard<std::mutex> lock(cuda_mu_);
    if (cuda_closed_.ok()) cuda_closed_ = absl::CancelledError("link closed");
    cuda_cv_.notify_all();
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    offering_end_ = true;
  }
  options_ = options;
  if (options.mode == DataPlaneMode::kGrpc) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDataPlaneOptions(options));
  Frame offer;
  offer.set_job_id(job_id_);
  offer.set_epoch(epoch_);
  offer.set_kind(gpipe::v1::DATA_PLANE_OFFER);
  offer.set_from_stage(from_stage);
  RETURN_IF_ERROR(OfferCudaIpc(options, &offer));
  if (options.mode == DataPlaneMode::kCudaIpc) {
    std::lock_guard<std::mutex> lock(mu_);
    awaiting_answer_ = true;
  } else if (absl::Status shm = OfferShm(options, &offer); !shm.ok()) {
    return shm;
  }
  if (!offer.has_shm_offer() && !offer.has_cuda_ipc_offer()) {
    return absl::OkStatus();
  }
  if (!WriteLocked(FrameToBuffer(offer))) {
    return absl::UnavailableError(
        "the next stage closed the link before the data-plane offer");
  }
  return absl::OkStatus();
}

// The device buffer goes into the offer when the mode allows it and this
// stage computes on a GPU; forced CUDA IPC that cannot be offered fails.
absl::Status GrpcLink::OfferCudaIpc(const DataPlaneOptions& options,
                                    Frame* offer) {
  const bool forced = options.mode == DataPlaneMode::kCudaIpc;
  if (!forced && options.mode != DataPlaneMode::kAuto) return absl::OkStatus();
  std::string why;
  if (!options.on_gpu) {
    why = "this stage does not compute on a GPU";
  } else {
    absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> buffer =
        CudaIpcBuffer::Create(options.cuda_ipc_ring_bytes, NewNonce(),
                              offer->mutable_cuda_ipc_offer());
    if (buffer.ok()) {
      const HostIdentity host = ThisHost();
      offer->mutable_cuda_ipc_offer()->set_boot_id(host.boot_id);
      offer->mutable_cuda_ipc_offer()->set_ipc_namespace(host.ipc_namespace);
      std::lock_guard<std::mutex> lock(mu_);
      offered_cuda_ = *std::move(buffer);
      return absl::OkStatus();
    }
    why = std::string(buffer.status().message());
    offer->clear_cuda_ipc_offer();
  }
  if (forced) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data_plane cuda_ipc: ", why));
  }
  if (options.on_gpu) {
    std::lock_guard<std::mutex> lock(mu_);
    refusal_ = absl::StrCat("no CUDA IPC: ", why);
  }
  return absl::OkStatus();
}

absl::Status GrpcLink::OfferShm(const DataPlaneOptions& options, Frame* offer) {
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
    if (offered_cuda_ != nullptr) awaiting_answer_ = true;
    return absl::OkStatus();
  }
  gpipe::v1::ShmOffer* o = offer->mutable_shm_offer();
  const HostIdentity host = ThisHost();
  o->set_pid(getpid());
  o->set_fd((*segment)->fd());
  o->set_segment_bytes(ShmSegmentBytes(options.ring_bytes));
  o->set_ring_bytes(options.ring_bytes);
  o->set_nonce(nonce);
  o->set_boot_id(host.boot_id);
  o->set_ipc_namespace(host.ipc_namespace);
  std::lock_guard<std::mutex> lock(mu_);
  offered_ = *std::move(segment);
  awaiting_answer_ = true;
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
  bool offering_end, plane_set;
  {
    std::lock_guard<std::mutex> lock(mu_);
    offering_end = offering_end_;
    plane_set = shm_ != nullptr || cuda_ != nullptr;
  }
  // Taking a second offer would replace a plane in use (a channel Send is
  // blocked in, a running shared-memory reader).
  if (offering_end || plane_set || offer_seen_ || offered_ != nullptr ||
      offered_cuda_ != nullptr) {
    return absl::InvalidArgumentError(
        "frame: a second data-plane offer, or one from the downstream end");
  }
  offer_seen_ = true;
  Frame answer;
  answer.set_job_id(job_id_);
  answer.set_epoch(epoch_);
  answer.set_kind(gpipe::v1::DATA_PLANE_ANSWER);
  const std::string cuda_refusal = TakeCudaIpcOffer(f, &answer);
  if (cuda_refusal.empty()) {
    if (!WriteLocked(FrameToBuffer(answer))) {
      return absl::UnavailableError("the upstream stage went away");
    }
    LogInfo("link of %s epoch %d from stage %d: data plane cuda_ipc", job_id_,
            epoch_, f.from_stage());
    return absl::OkStatus();
  }
  const gpipe::v1::ShmOffer& o = f.shm_offer();
  std::string refusal =
      options_.mode == DataPlaneMode::kGrpc
          ? "this worker runs --data_plane grpc"
      : options_.mode == DataPlaneMode::kCudaIpc
          ? cuda_refusal
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
  answer.set_data_plane(segment != nullptr ? "shm" : "grpc");
  if (segment != nullptr) answer.set_answer_nonce(answer_nonce);
  if (f.has_cuda_ipc_offer() && options_.mode == DataPlaneMode::kAuto) {
    // Say why the device buffer was refused too (the upstream logs it).
    refusal = absl::StrCat("no CUDA IPC: ", cuda_refusal,
                           segment != nullptr
                               ? std::string()
                               : absl::StrCat("; no shared memory: ", refusal));
  }
  answer.set_refusal(refusal);
  if (segment != nullptr) {
    // The agreed segment's ring decides, not this worker's own flag: both
    // directions then receive tensors of up to an eighth of it in place.
    const int64_t chunk = segment->ring_bytes() / 8;
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
  if (options_.mode == DataPlaneMode::kCudaIpc) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data_plane cuda_ipc: cannot open the upstream stage's device "
        "buffer: ",
        refusal));
  }
  return absl::OkStatus();
}

std::string GrpcLink::TakeCudaIpcOffer(const Frame& f, Frame* answer) {
  if (options_.mode != DataPlaneMode::kAuto &&
      options_.mode != DataPlaneMode::kCudaIpc) {
    return "not allowed by --data_plane";
  }
  if (!f.has_cuda_ipc_offer()) return "no device buffer was offered";
  if (!options_.on_gpu) return "this stage does not compute on a GPU";
  const gpipe::v1::CudaIpcOffer& o = f.cuda_ipc_offer();
  if (std::string why = CudaIpcOfferMismatch(o, ThisHost(), CurrentGpuUuid());
      !why.empty()) {
    return why;
  }
  const uint64_t answer_nonce = NewNonce();
  absl::StatusOr<std::unique_ptr<CudaIpcBuffer>> buffer =
      CudaIpcBuffer::Open(o, answer_nonce);
  if (!buffer.ok()) return std::string(buffer.status().message());
  answer->set_data_plane("cuda_ipc");
  answer->set_answer_nonce(answer_nonce);
  std::lock_guard<std::mutex> lock(mu_);
  cuda_ = std::make_unique<CudaIpcChannel>(*std::move(buffer),
                                           /*creator=*/false, job_id_, epoch_);
  plane_ = DataPlane::kCudaIpc;
  return "";
}

absl::Status GrpcLink::HandleAnswer(const Frame& f) {
  if (f.job_id() != job_id_ || f.epoch() != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data-plane answer of job '", f.job_id(), "' epoch ", f.epoch(),
        " on a link of job '", job_id_, "' epoch ", epoch_, ": rejected"));
  }
  if (offered_ == nullptr && offered_cuda_ == nullptr) {
    return absl::InvalidArgumentError("frame: a data-plane answer to no offer");
  }
  std::string refusal = f.refusal();
  std::shared_ptr<ShmChannel> channel;
  std::unique_ptr<CudaIpcChannel> cuda;
  if (f.data_plane() == "cuda_ipc" && offered_cuda_ != nullptr) {
    // The answer's nonce, read back through our own buffer: the peer wrote
    // it there through its mapping.
    absl::StatusOr<uint64_t> seen = offered_cuda_->ReadAnswerNonce();
    if (!seen.ok() || *seen != f.answer_nonce() || f.answer_nonce() == 0) {
      refusal = "the peer's answer is not in the device buffer";
    } else {
      cuda = std::make_unique<CudaIpcChannel>(
          std::move(offered_cuda_), /*creator=*/true, job_id_, epoch_);
    }
  } else if (f.data_plane() == "shm" && offered_ != nullptr) {
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
  offered_cuda_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  if (cuda != nullptr) {
    cuda_ = std::move(cuda);
    plane_ = DataPlane::kCudaIpc;
  } else if (channel != nullptr) {
    UseShmLocked(std::move(channel));
    if (!refusal.empty()) refusal_ = refusal;  // why not CUDA IPC
  } else {
    refusal_ = refusal;
    if (options_.mode == DataPlaneMode::kCudaIpc) {
      plane_status_ = absl::FailedPreconditionError(absl::StrCat(
          "--data_plane cuda_ipc: the next stage cannot open this one's "
          "device buffer: ",
          refusal));
    } else if (options_.mode == DataPlaneMode::kShm) {
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

// Each chunk is copied device to device into the ring, then its descriptor
// goes down the stream; the receiver copies it out after the chunk's event
// and gives it back with CUDA_IPC_RELEASE.
absl::Status GrpcLink::SendCudaIpc(const Message& m, CudaIpcChannel* cuda) {
  absl::Status failed;
  const char* src =
      m.tensor.defined() ? static_cast<const char*>(m.tensor.raw()) : nullptr;
  Frame descriptor;
  const bool ok = EncodeFrameFields(
      m, job_id_, epoch_,
      [&](const Frame& fields, int64_t at, int64_t n) {
        if (n == 0) return WriteLocked(FrameToBuffer(fields));
        absl::StatusOr<gpipe::v1::ShmSlot> slot = cuda->Reserve(n);
        if (slot.ok()) failed = cuda->Write(*slot, src + at);
        if (!slot.ok()) failed = slot.status();
        if (!failed.ok()) return false;
        descriptor = fields;
        *descriptor.mutable_cuda_ipc_slot() = *slot;
        return WriteLocked(FrameToBuffer(descriptor));
      },
      cuda->chunk_bytes());
  if (ok) return absl::OkStatus();
  return failed.ok() ? absl::UnavailableError("the stream broke") : failed;
}

// The reader thread checks the descriptor; a complete tensor queues its
// message now and its bytes for Receive.
absl::StatusOr<std::optional<Message>> GrpcLink::ReceiveCudaIpc(
    const ReceivedFrame& frame) {
  if (cuda_ == nullptr) {
    return absl::InvalidArgumentError(
        "frame: a CUDA IPC descriptor on a link without CUDA IPC");
  }
  if (frame.payload_size() != 0) {
    return absl::InvalidArgumentError(
        "frame: both a payload and a CUDA IPC descriptor");
  }
  ASSIGN_OR_RETURN(CudaIpcChunk c, cuda_->Accept(frame.fields()));
  std::optional<Message> m;
  std::lock_guard<std::mutex> lock(cuda_mu_);
  if (c.first) {
    auto t = std::make_shared<ArrivingTensor>();
    t->message = c.message;
    t->shape = c.shape;
    t->dtype = c.dtype;
    cuda_pending_.push_back(t);
    cuda_arriving_ = std::move(t);
    m = c.message;
  }
  cuda_arriving_->chunks.push_back(c.slot);
  if (c.last) {
    cuda_arriving_->complete = true;
    cuda_arriving_.reset();
  }
  cuda_cv_.notify_all();
  return m;
}

absl::Status GrpcLink::ReadDeviceTensor(Message& m) {
  std::shared_ptr<ArrivingTensor> t;
  {
    std::lock_guard<std::mutex> lock(cuda_mu_);
    if (cuda_pending_.empty() || cuda_ == nullptr) {
      return absl::InternalError(
          absl::StrCat(Describe(m), " arrived without its tensor"));
    }
    t = std::move(cuda_pending_.front());
    cuda_pending_.pop_front();
  }
  if (t->message.kind != m.kind || t->message.step != m.step ||
      t->message.micro_batch != m.micro_batch) {
    return absl::InternalError(absl::StrCat(
        Describe(m), " arrived with the tensor of ", Describe(t->message)));
  }
  // In the stage's device memory, on its stream; each chunk is released as
  // soon as it is copied, so the sender can reuse its place in the ring.
  Tensor out = Tensor::Empty(t->shape, t->dtype, Device::kCuda);
  char* dst = static_cast<char*>(out.raw());
  for (;;) {
    gpipe::v1::ShmSlot chunk;
    {
      std::unique_lock<std::mutex> lock(cuda_mu_);
      cuda_cv_.wait(lock, [&] {
        return !t->chunks.empty() || t->complete || !cuda_closed_.ok();
      });
      if (t->chunks.empty()) {
        if (t->complete) break;
        return cuda_closed_;
      }
      chunk = t->chunks.front();
      t->chunks.pop_front();
    }
    RETURN_IF_ERROR(cuda_->ReadChunk(chunk, dst));
    dst += chunk.length();
    if (!WriteCudaRelease(chunk.sequence())) {
      return absl::UnavailableError("the neighbouring stage closed the link");
    }
  }
  m.tensor = std::move(out);
  return absl::OkStatus();
}

bool GrpcLink::WriteCudaRelease(int64_t sequence) {
  Frame release;
  release.set_job_id(job_id_);
  release.set_epoch(epoch_);
  release.set_kind(gpipe::v1::CUDA_IPC_RELEASE);
  release.mutable_cuda_ipc_slot()->set_sequence(sequence);
  return WriteLocked(FrameToBuffer(release));
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
    } else if (f.kind() == gpipe::v1::CUDA_IPC_RELEASE) {
      if (cuda_ == nullptr) {
        m = absl::InvalidArgumentError(
            "frame: a CUDA IPC release on a link without CUDA IPC");
      } else if (absl::Status s = cuda_->Release(f.cuda_ipc_slot().sequence());
                 !s.ok()) {
        m = s;
      }
    } else if (f.has_cuda_ipc_slot()) {
      m = ReceiveCudaIpc(frame);
    } else if (options_.mode == DataPlaneMode::kShm && offered_ == nullptr &&
               shm_ == nullptr && !offer_seen_) {
      m = absl::FailedPreconditionError(
          "--data_plane shm: the upstream stage sends frames without offering "
          "shared memory");
    } else if (options_.mode == DataPlaneMode::kCudaIpc &&
               offered_cuda_ == nullptr && cuda_ == nullptr && !offer_seen_) {
      m = absl::FailedPreconditionError(
          "--data_plane cuda_ipc: the upstream stage sends frames without "
          "offering a device buffer");
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
    if (cuda_ != nullptr) cuda_->Close(why);
  }
  {
    std::lock_guard<std::mutex> lock(cuda_mu_);
    if (cuda_closed_.ok()) cuda_closed_ = why;
    cuda_cv_.notify_all();
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
