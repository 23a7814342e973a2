#include "services/transport/plane_negotiator.h"

#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "services/core/log.h"
#include "services/core/status.h"
#include "services/transport/cuda_ipc_data_plane.h"
#include "services/transport/cuda_ipc_plane.h"
#include "services/transport/shm_data_plane.h"

namespace gpipe {
namespace {

using gpipe::v1::Frame;

// A nonce no other segment is likely to hold (never 0: 0 is "unanswered").
uint64_t NewNonce() {
  std::random_device rd;
  uint64_t n = 0;
  while (n == 0) n = (uint64_t{rd()} << 32) ^ rd();
  return n;
}

}  // namespace

std::string PlaneRefusal::ToString() const {
  std::string out;
  if (!cuda_ipc.empty()) absl::StrAppend(&out, "no CUDA IPC: ", cuda_ipc);
  if (!shm.empty()) {
    absl::StrAppend(&out, out.empty() ? "" : "; ", "no shared memory: ", shm);
  }
  return out;
}

void PlaneNegotiator::set_options(const DataPlaneOptions& options) {
  absl::MutexLock lock(&mu_);
  options_ = options;
}

absl::Status PlaneNegotiator::CheckFencing(const Frame& f,
                                           const char* what) const {
  if (f.job_id() == context_.job_id && f.epoch() == context_.epoch) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, " of job '", f.job_id(), "' epoch ", f.epoch(),
                   " on a link of job '", context_.job_id, "' epoch ",
                   context_.epoch, ": rejected"));
}

absl::Status PlaneNegotiator::Offer(const DataPlaneOptions& options,
                                    int64_t from_stage) {
  {
    absl::MutexLock lock(&mu_);
    offering_end_ = true;
    options_ = options;
  }
  if (options.mode == DataPlaneMode::kGrpc) return absl::OkStatus();
  RETURN_IF_ERROR(ValidateDataPlaneOptions(options));
  Frame offer;
  offer.set_job_id(context_.job_id);
  offer.set_epoch(context_.epoch);
  offer.set_kind(gpipe::v1::DATA_PLANE_OFFER);
  offer.set_from_stage(from_stage);
  RETURN_IF_ERROR(OfferCudaIpc(options, &offer));
  if (options.mode == DataPlaneMode::kCudaIpc) {
    absl::MutexLock lock(&mu_);
    awaiting_answer_ = true;
  } else {
    RETURN_IF_ERROR(OfferShm(options, &offer));
  }
  if (!offer.has_shm_offer() && !offer.has_cuda_ipc_offer()) {
    return absl::OkStatus();
  }
  if (!context_.control->WriteFrame(offer)) {
    return absl::UnavailableError(
        "the next stage closed the link before the data-plane offer");
  }
  return absl::OkStatus();
}

// The device buffer goes into the offer when the mode allows it and this
// stage computes on a GPU; forced CUDA IPC that cannot be offered fails.
absl::Status PlaneNegotiator::OfferCudaIpc(const DataPlaneOptions& options,
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
      absl::MutexLock lock(&mu_);
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
  // A CPU stage does not consider CUDA IPC at all: nothing to report.
  if (options.on_gpu) {
    absl::MutexLock lock(&mu_);
    refusal_.cuda_ipc = why;
  }
  return absl::OkStatus();
}

absl::Status PlaneNegotiator::OfferShm(const DataPlaneOptions& options,
                                       Frame* offer) {
  const uint64_t nonce = NewNonce();
  absl::StatusOr<std::unique_ptr<ShmSegment>> segment =
      ShmSegment::Create(options.ring_bytes, nonce);
  if (!segment.ok()) {
    if (options.mode == DataPlaneMode::kShm) {
      return absl::FailedPreconditionError(
          absl::StrCat("--data_plane shm: ", segment.status().message()));
    }
    absl::MutexLock lock(&mu_);
    refusal_.shm = std::string(segment.status().message());
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
  absl::MutexLock lock(&mu_);
  offered_shm_ = *std::move(segment);
  awaiting_answer_ = true;
  return absl::OkStatus();
}

// The downstream end opens the offered device buffer or maps the offered
// segment when its mode allows and the offer is from this host, then
// answers either way.
absl::Status PlaneNegotiator::HandleOffer(const Frame& f) {
  RETURN_IF_ERROR(CheckFencing(f, "data-plane offer"));
  DataPlaneOptions options;
  {
    absl::MutexLock lock(&mu_);
    // Taking a second offer would replace a plane in use (a channel Send
    // is blocked in, a running shared-memory reader).
    if (offering_end_ || plane_ != nullptr || offer_seen_ ||
        offered_shm_ != nullptr || offered_cuda_ != nullptr) {
      return absl::InvalidArgumentError(
          "frame: a second data-plane offer, or one from the downstream end");
    }
    offer_seen_ = true;
    options = options_;
  }
  Frame answer;
  answer.set_job_id(context_.job_id);
  answer.set_epoch(context_.epoch);
  answer.set_kind(gpipe::v1::DATA_PLANE_ANSWER);
  const std::string cuda_refusal = TakeCudaIpcOffer(f, options, &answer);
  if (cuda_refusal.empty()) {
    if (!context_.control->WriteFrame(answer)) {
      return absl::UnavailableError("the upstream stage went away");
    }
    LogInfo("link of %s epoch %d from stage %d: data plane cuda_ipc",
            context_.job_id, context_.epoch, f.from_stage());
    return absl::OkStatus();
  }
  PlaneRefusal refusal;
  if (f.has_cuda_ipc_offer()) refusal.cuda_ipc = cuda_refusal;
  const gpipe::v1::ShmOffer& o = f.shm_offer();
  // Read by the upstream stage too (the answer carries it): the worker
  // named is this one, the receiving end.
  refusal.shm = options.mode == DataPlaneMode::kGrpc
                    ? "the receiving worker runs --data_plane grpc"
                : options.mode == DataPlaneMode::kCudaIpc
                    ? "the receiving worker runs --data_plane cuda_ipc"
                : f.has_shm_offer() ? OfferMismatch(o, ThisHost())
                                    : std::string("no segment was offered");
  std::unique_ptr<ShmSegment> segment;
  const uint64_t answer_nonce = NewNonce();
  if (refusal.shm.empty()) {
    absl::StatusOr<std::unique_ptr<ShmSegment>> mapped = ShmSegment::OpenPeer(
        o.pid(), o.fd(), o.ring_bytes(), o.nonce(), answer_nonce);
    if (mapped.ok()) {
      segment = *std::move(mapped);
    } else {
      refusal.shm = std::string(mapped.status().message());
    }
  }
  const bool shm = segment != nullptr;
  answer.set_data_plane(shm ? "shm" : "grpc");
  if (shm) answer.set_answer_nonce(answer_nonce);
  answer.set_refusal(refusal.ToString());
  answer.set_cuda_ipc_refusal(refusal.cuda_ipc);
  answer.set_shm_refusal(refusal.shm);
  {
    absl::MutexLock lock(&mu_);
    if (shm) {
      // The agreed segment's ring decides, not this worker's own flag:
      // both directions then receive tensors of up to an eighth of it in
      // place.
      const int64_t chunk = segment->ring_bytes() / 8;
      plane_ = std::make_unique<ShmDataPlane>(
          context_, std::make_shared<ShmChannel>(std::move(segment),
                                                 /*creator=*/false, chunk));
    }
    refusal_ = refusal;
  }
  if (!context_.control->WriteFrame(answer)) {
    return absl::UnavailableError("the upstream stage went away");
  }
  LogInfo("link of %s epoch %d from stage %d: data plane %s%s", context_.job_id,
          context_.epoch, f.from_stage(), answer.data_plane(),
          refusal.empty() ? std::string()
                          : absl::StrCat(" (", refusal.ToString(), ")"));
  if (!shm && options.mode == DataPlaneMode::kShm) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data_plane shm: cannot map the upstream stage's segment: ",
        refusal.shm));
  }
  if (options.mode == DataPlaneMode::kCudaIpc) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--data_plane cuda_ipc: cannot open the upstream stage's device "
        "buffer: ",
        cuda_refusal));
  }
  return absl::OkStatus();
}

std::string PlaneNegotiator::TakeCudaIpcOffer(const Frame& f,
                                              const DataPlaneOptions& options,
                                              Frame* answer) {
  if (options.mode != DataPlaneMode::kAuto &&
      options.mode != DataPlaneMode::kCudaIpc) {
    return "the receiving worker's --data_plane does not allow it";
  }
  if (!f.has_cuda_ipc_offer()) return "no device buffer was offered";
  if (!options.on_gpu) return "the receiving stage does not compute on a GPU";
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
  absl::MutexLock lock(&mu_);
  plane_ = std::make_unique<CudaIpcDataPlane>(
      context_,
      std::make_unique<CudaIpcChannel>(*std::move(buffer), /*creator=*/false,
                                       context_.job_id, context_.epoch),
      frames_);
  return "";
}

absl::Status PlaneNegotiator::HandleAnswer(const Frame& f) {
  RETURN_IF_ERROR(CheckFencing(f, "data-plane answer"));
  std::unique_ptr<ShmSegment> offered_shm;
  std::unique_ptr<CudaIpcBuffer> offered_cuda;
  DataPlaneOptions options;
  PlaneRefusal refusal;
  {
    absl::MutexLock lock(&mu_);
    if (offered_shm_ == nullptr && offered_cuda_ == nullptr) {
      return absl::InvalidArgumentError(
          "frame: a data-plane answer to no offer");
    }
    offered_shm = std::move(offered_shm_);
    offered_cuda = std::move(offered_cuda_);
    options = options_;
    // What this end could not offer stays the reason.
    refusal.cuda_ipc =
        !refusal_.cuda_ipc.empty() ? refusal_.cuda_ipc : f.cuda_ipc_refusal();
    refusal.shm = !refusal_.shm.empty() ? refusal_.shm : f.shm_refusal();
    // A peer that only says why in words (an older worker): keep them.
    if (refusal.empty() && !f.refusal().empty()) refusal.shm = f.refusal();
  }
  std::shared_ptr<ShmChannel> channel;
  std::unique_ptr<CudaIpcChannel> cuda;
  if (f.data_plane() == "cuda_ipc" && offered_cuda != nullptr) {
    // The answer's nonce, read back through our own buffer: the peer wrote
    // it there through its mapping.
    absl::StatusOr<uint64_t> seen = offered_cuda->ReadAnswerNonce();
    if (!seen.ok() || *seen != f.answer_nonce() || f.answer_nonce() == 0) {
      refusal.cuda_ipc = "the peer's answer is not in the device buffer";
    } else {
      cuda = std::make_unique<CudaIpcChannel>(std::move(offered_cuda),
                                              /*creator=*/true, context_.job_id,
                                              context_.epoch);
    }
  } else if (f.data_plane() == "shm" && offered_shm != nullptr) {
    if (offered_shm->answer_nonce() != f.answer_nonce() ||
        f.answer_nonce() == 0) {
      refusal.shm = "the peer's answer is not in the segment (another host?)";
    } else {
      offered_shm->CloseFd();
      const int64_t chunk =
          std::min(options.chunk_bytes, offered_shm->ring_bytes() / 2);
      channel = std::make_shared<ShmChannel>(std::move(offered_shm),
                                             /*creator=*/true, chunk);
    }
  } else if (refusal.empty()) {
    refusal.shm = absl::StrCat("the peer answered '", f.data_plane(), "'");
  }
  absl::MutexLock lock(&mu_);
  if (cuda != nullptr) {
    plane_ =
        std::make_unique<CudaIpcDataPlane>(context_, std::move(cuda), frames_);
    refusal_ = PlaneRefusal();
  } else if (channel != nullptr) {
    plane_ = std::make_unique<ShmDataPlane>(context_, std::move(channel));
    refusal_ = PlaneRefusal{refusal.cuda_ipc, ""};
  } else {
    refusal_ = refusal;
    if (options.mode == DataPlaneMode::kCudaIpc) {
      plane_status_ = absl::FailedPreconditionError(absl::StrCat(
          "--data_plane cuda_ipc: the next stage cannot open this one's "
          "device buffer: ",
          refusal.cuda_ipc.empty() ? refusal.ToString() : refusal.cuda_ipc));
    } else if (options.mode == DataPlaneMode::kShm) {
      plane_status_ = absl::FailedPreconditionError(absl::StrCat(
          "--data_plane shm: the next stage cannot share memory with this "
          "one: ",
          refusal.shm.empty() ? refusal.ToString() : refusal.shm));
    }
  }
  awaiting_answer_ = false;
  return absl::OkStatus();
}

absl::Status PlaneNegotiator::CheckFramesAllowed() const {
  absl::MutexLock lock(&mu_);
  if (plane_ != nullptr || offer_seen_) return absl::OkStatus();
  if (options_.mode == DataPlaneMode::kShm && offered_shm_ == nullptr) {
    return absl::FailedPreconditionError(
        "--data_plane shm: the upstream stage sends frames without offering "
        "shared memory");
  }
  if (options_.mode == DataPlaneMode::kCudaIpc && offered_cuda_ == nullptr) {
    return absl::FailedPreconditionError(
        "--data_plane cuda_ipc: the upstream stage sends frames without "
        "offering a device buffer");
  }
  return absl::OkStatus();
}

absl::StatusOr<DataPlane*> PlaneNegotiator::AwaitPlane() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &PlaneNegotiator::answered));
  if (!plane_status_.ok()) return plane_status_;
  return plane_ != nullptr ? plane_.get() : frames_;
}

absl::StatusOr<DataPlaneKind> PlaneNegotiator::WaitKind(
    std::chrono::milliseconds timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(this, &PlaneNegotiator::answered),
                            absl::FromChrono(timeout))) {
    return absl::DeadlineExceededError(
        "the next stage has not answered the data-plane offer yet");
  }
  if (!plane_status_.ok()) return plane_status_;
  if (awaiting_answer_) {
    return read_failure_.ok()
               ? absl::UnavailableError(
                     "the next stage closed the link before answering the "
                     "data-plane offer")
               : read_failure_;
  }
  return plane_ != nullptr ? plane_->kind() : DataPlaneKind::kGrpc;
}

DataPlane* PlaneNegotiator::agreed() const {
  absl::MutexLock lock(&mu_);
  return plane_.get();
}

int64_t PlaneNegotiator::mapped_bytes() const {
  absl::MutexLock lock(&mu_);
  // An offered segment is mapped (and pre-faulted) until the answer.
  if (offered_shm_ != nullptr) return offered_shm_->bytes();
  return plane_ != nullptr ? plane_->mapped_bytes() : 0;
}

bool PlaneNegotiator::CarriesDeviceTensors() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &PlaneNegotiator::answered));
  return plane_ != nullptr && plane_->CarriesDeviceTensors();
}

PlaneRefusal PlaneNegotiator::refusal() const {
  absl::MutexLock lock(&mu_);
  return refusal_;
}

void PlaneNegotiator::Close(const absl::Status& why,
                            const absl::Status& read_failure) {
  DataPlane* plane;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    if (read_failure_.ok()) read_failure_ = read_failure;
    plane = plane_.get();
  }
  if (plane != nullptr) plane->Close(why);
}

void PlaneNegotiator::Stop(const absl::Status& why, bool drain) {
  if (DataPlane* plane = agreed(); plane != nullptr) plane->Stop(why, drain);
}

}  // namespace gpipe
