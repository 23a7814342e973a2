#include "services/transport/cuda_ipc_data_plane.h"

#include <chrono>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "services/core/log.h"
#include "services/core/status.h"

namespace gpipe {

using gpipe::v1::Frame;

namespace {

bool SyncReleaseRequested() {
  const char* v = std::getenv("GPIPE_CUDA_IPC_SYNC_RELEASE");
  return v != nullptr && std::string_view(v) == "1";
}

}  // namespace

CudaIpcDataPlane::CudaIpcDataPlane(const PlaneContext& context,
                                   std::unique_ptr<CudaIpcChannel> channel,
                                   FrameDataPlane* frames)
    : context_(context), channel_(std::move(channel)), frames_(frames) {
  if (!SyncReleaseRequested()) {
    releaser_ = std::make_unique<OrderedReleaser>(
        [this](int64_t sequence) { return channel_->AwaitCopiedOut(sequence); },
        [this](int64_t sequence) { return WriteRelease(sequence); });
  }
}

CudaIpcDataPlane::~CudaIpcDataPlane() {
  if (chunks_in_ == 0) return;
  LogInfo(
      "cuda_ipc link: %d chunks in; %.3f s waiting for the sender's copies, "
      "%.3f s for copies out (%s)",
      chunks_in_, sender_wait_seconds_,
      releaser_ != nullptr ? releaser_->await_seconds() : copy_wait_seconds_,
      releaser_ != nullptr ? "on the releasing thread"
                           : "on the stage's thread: "
                             "GPIPE_CUDA_IPC_SYNC_RELEASE=1");
}

// Each chunk is copied device to device into the ring, then its descriptor
// goes down the stream; the receiver copies it out after the chunk's event
// and gives it back with CUDA_IPC_RELEASE.
absl::Status CudaIpcDataPlane::Send(const Message& m) {
  absl::Status failed;
  const char* src =
      m.tensor.defined() ? static_cast<const char*>(m.tensor.raw()) : nullptr;
  Frame descriptor;
  const bool ok = EncodeFrameFields(
      m, context_.job_id, context_.epoch,
      [&](const Frame& fields, int64_t at, int64_t n) {
        if (n == 0) return context_.control->WriteFrame(fields);
        absl::StatusOr<gpipe::v1::ShmSlot> slot = channel_->Reserve(n);
        if (slot.ok()) failed = channel_->Write(*slot, src + at);
        if (!slot.ok()) failed = slot.status();
        if (!failed.ok()) return false;
        descriptor = fields;
        *descriptor.mutable_cuda_ipc_slot() = *slot;
        return context_.control->WriteFrame(descriptor);
      },
      channel_->chunk_bytes());
  if (ok) return absl::OkStatus();
  return failed.ok() ? absl::UnavailableError("the stream broke") : failed;
}

absl::StatusOr<std::optional<Message>> CudaIpcDataPlane::OnFrame(
    const ReceivedFrame& frame) {
  const Frame& f = frame.fields();
  if (f.kind() == gpipe::v1::CUDA_IPC_RELEASE) {
    RETURN_IF_ERROR(channel_->Release(f.cuda_ipc_slot().sequence()));
    return std::optional<Message>();
  }
  if (f.has_cuda_ipc_slot()) return OnDescriptor(frame);
  return frames_->OnFrame(frame);
}

// The reader thread checks the descriptor; a tensor's first chunk queues
// its message now, and every chunk its bytes for ReceiveTensor.
absl::StatusOr<std::optional<Message>> CudaIpcDataPlane::OnDescriptor(
    const ReceivedFrame& frame) {
  if (frame.payload_size() != 0) {
    return absl::InvalidArgumentError(
        "frame: both a payload and a CUDA IPC descriptor");
  }
  ASSIGN_OR_RETURN(CudaIpcChunk c, channel_->Accept(frame.fields()));
  std::optional<Message> m;
  absl::MutexLock lock(&mu_);
  if (c.first) {
    auto t = std::make_shared<ArrivingTensor>();
    t->message = c.message;
    t->shape = c.shape;
    t->dtype = c.dtype;
    pending_.push_back(t);
    arriving_ = std::move(t);
    m = c.message;
  }
  arriving_->chunks.push_back(c.slot);
  if (c.last) {
    arriving_->complete = true;
    arriving_.reset();
  }
  return m;
}

absl::Status CudaIpcDataPlane::ReceiveTensor(Message& m) {
  std::shared_ptr<ArrivingTensor> t;
  {
    absl::MutexLock lock(&mu_);
    if (pending_.empty()) {
      return absl::InternalError(
          absl::StrCat(Describe(m), " arrived without its tensor"));
    }
    t = std::move(pending_.front());
    pending_.pop_front();
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
      absl::MutexLock lock(&mu_);
      const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !t->chunks.empty() || t->complete || !closed_.ok();
      };
      mu_.Await(absl::Condition(&ready));
      if (t->chunks.empty()) {
        if (t->complete) break;
        return closed_;
      }
      chunk = t->chunks.front();
      t->chunks.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(channel_->ReadChunk(chunk, dst));
    const auto copied = std::chrono::steady_clock::now();
    sender_wait_seconds_ +=
        std::chrono::duration<double>(copied - start).count();
    ++chunks_in_;
    dst += chunk.length();
    if (releaser_ != nullptr) {
      ASSIGN_OR_RETURN(const bool queued, releaser_->Add(chunk.sequence()));
      if (queued) continue;
      // The link is ending (Stop): what arrived before still goes back,
      // from here, as the releaser has given back everything before it.
    }
    RETURN_IF_ERROR(channel_->AwaitCopiedOut(chunk.sequence()));
    copy_wait_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - copied)
            .count();
    if (!WriteRelease(chunk.sequence())) {
      return absl::UnavailableError(
          "the neighbouring stage closed the link or stopped "
          "answering");
    }
  }
  m.tensor = std::move(out);
  return absl::OkStatus();
}

void CudaIpcDataPlane::Stop(const absl::Status& why, bool drain) {
  Close(why);
  // Its last release written before the link's stream may go.
  if (releaser_ != nullptr) releaser_->Stop();
}

bool CudaIpcDataPlane::WriteRelease(int64_t sequence) {
  Frame release;
  release.set_job_id(context_.job_id);
  release.set_epoch(context_.epoch);
  release.set_kind(gpipe::v1::CUDA_IPC_RELEASE);
  release.mutable_cuda_ipc_slot()->set_sequence(sequence);
  return context_.control->WriteFrame(release);
}

void CudaIpcDataPlane::Close(const absl::Status& why) {
  channel_->Close(why);
  absl::MutexLock lock(&mu_);
  if (closed_.ok()) closed_ = why;
}

}  // namespace gpipe
