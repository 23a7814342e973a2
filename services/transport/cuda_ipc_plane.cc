#include "services/transport/cuda_ipc_plane.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gpipe {
namespace {

std::string Hex(const std::string& bytes) {
  return bytes.empty() ? std::string("none") : absl::BytesToHexString(bytes);
}

bool CarriesTensor(gpipe::v1::FrameKind k) {
  return k == gpipe::v1::ACTIVATION || k == gpipe::v1::GRADIENT;
}

}  // namespace

std::string CudaIpcOfferMismatch(const gpipe::v1::CudaIpcOffer& offer,
                                 const HostIdentity& here,
                                 const std::string& local_uuid) {
  if (offer.boot_id().empty() || offer.boot_id() != here.boot_id) {
    return absl::StrCat("another host (boot id '", offer.boot_id(), "', here '",
                        here.boot_id, "')");
  }
  if (local_uuid.empty()) return "no GPU in this process";
  if (offer.device_uuid() != local_uuid) {
    return absl::StrCat("another GPU (", Hex(offer.device_uuid()), ", here ",
                        Hex(local_uuid), ")");
  }
  if (offer.ring_bytes() < kMinShmRingBytes ||
      offer.ring_bytes() > kMaxShmRingBytes) {
    return absl::StrCat("a device ring of ", offer.ring_bytes(),
                        " bytes is out of bounds");
  }
  if (offer.buffer_bytes() != CudaIpcBufferBytes(offer.ring_bytes())) {
    return absl::StrCat("a device buffer of ", offer.buffer_bytes(),
                        " bytes does not hold two rings of ",
                        offer.ring_bytes());
  }
  if (offer.memory_handle().size() != kCudaIpcHandleBytes) {
    return absl::StrCat("a memory handle of ", offer.memory_handle().size(),
                        " bytes");
  }
  if (offer.event_handles_size() != 2 * kCudaIpcEvents) {
    return absl::StrCat(offer.event_handles_size(), " event handles, not ",
                        2 * kCudaIpcEvents);
  }
  for (const std::string& e : offer.event_handles()) {
    if (e.size() != kCudaIpcHandleBytes) {
      return absl::StrCat("an event handle of ", e.size(), " bytes");
    }
  }
  if (offer.nonce() == 0) return "no nonce in the offer";
  return "";
}

absl::StatusOr<CudaIpcChunk> CudaIpcAssembler::Add(const gpipe::v1::Frame& f) {
  if (f.job_id() != job_id_ || f.epoch() != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "frame of job '", f.job_id(), "' epoch ", f.epoch(),
        " on a link of job '", job_id_, "' epoch ", epoch_, ": rejected"));
  }
  if (!CarriesTensor(f.kind())) {
    return absl::InvalidArgumentError(
        "CUDA IPC descriptor: only activations and gradients have one");
  }
  if (!f.payload().empty()) {
    return absl::InvalidArgumentError(
        "CUDA IPC descriptor: both a payload and a device slot");
  }
  CudaIpcChunk next;
  int64_t expected = expected_;
  if (in_tensor_) {
    if (f.step() != partial_.step || f.micro_batch() != partial_.micro_batch ||
        (f.kind() == gpipe::v1::ACTIVATION) !=
            (partial_.kind == MessageKind::kActivation)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA IPC descriptor: chunk of micro-batch ", f.micro_batch(),
          " at step ", f.step(), " inside the tensor of micro-batch ",
          partial_.micro_batch, " at step ", partial_.step));
    }
  } else {
    const gpipe::v1::TensorHeader& h = f.header();
    if (h.dtype() != gpipe::v1::FLOAT32 && h.dtype() != gpipe::v1::INT32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA IPC descriptor: tensor dtype ", static_cast<int>(h.dtype()),
          " is not FLOAT32 or INT32"));
    }
    std::vector<int64_t> dims;
    int64_t numel = 1;
    for (int64_t d : h.shape().dims()) {
      if (d < 0 || (d > 0 && numel > kMaxTensorBytes / 4 / d)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "CUDA IPC descriptor: tensor shape has a bad dimension ", d));
      }
      numel *= d;
      dims.push_back(d);
    }
    if (dims.empty()) {
      return absl::InvalidArgumentError(
          "CUDA IPC descriptor: tensor without a shape");
    }
    if (f.total_bytes() != numel * 4 || numel == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA IPC descriptor: header announces ", f.total_bytes(),
          " bytes but shape ", Shape(dims).ToString(), " needs ", numel * 4));
    }
    next.message.kind = f.kind() == gpipe::v1::ACTIVATION
                            ? MessageKind::kActivation
                            : MessageKind::kGradient;
    next.message.step = f.step();
    next.message.micro_batch = f.micro_batch();
    next.shape = Shape(dims);
    next.dtype = h.dtype() == gpipe::v1::FLOAT32 ? DType::kF32 : DType::kI32;
    expected = numel * 4;
  }
  const int64_t already = in_tensor_ ? received_ : 0;
  const gpipe::v1::ShmSlot& slot = f.cuda_ipc_slot();
  if (slot.length() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC descriptor: chunk length ", slot.length(),
                     " is not positive"));
  }
  if (slot.length() > expected - already) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC descriptor: chunk runs past the announced ",
                     expected, " bytes"));
  }
  if (f.last() && already + slot.length() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC descriptor: tensor ended after ",
                     already + slot.length(), " of ", expected, " bytes"));
  }
  // The ring last: a rejected frame must leave it where it was.
  if (absl::StatusOr<int64_t> at = ring_.Accept(slot); !at.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC descriptor: ", at.status().message()));
  }
  if (!in_tensor_) {
    next.first = true;
    partial_ = next.message;
    expected_ = expected;
    received_ = 0;
    in_tensor_ = true;
  }
  received_ += slot.length();
  next.slot = slot;
  next.last = f.last();
  if (next.last) in_tensor_ = false;
  return next;
}

}  // namespace gpipe
