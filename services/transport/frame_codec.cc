#include "services/transport/frame_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace gpipe {
namespace {

using gpipe::v1::Frame;

gpipe::v1::FrameKind ToFrameKind(MessageKind k) {
  switch (k) {
    case MessageKind::kActivation:
      return gpipe::v1::ACTIVATION;
    case MessageKind::kGradient:
      return gpipe::v1::GRADIENT;
    case MessageKind::kGradSquares:
      return gpipe::v1::GRAD_SQUARES;
    case MessageKind::kEvalEnd:
      return gpipe::v1::EVAL_END;
    case MessageKind::kEvalTaken:
      return gpipe::v1::EVAL_TAKEN;
    case MessageKind::kEvalFailed:
      return gpipe::v1::EVAL_FAILED;
    case MessageKind::kReduceSlice:
      return gpipe::v1::REDUCE_SLICE;
  }
  return gpipe::v1::FRAME_KIND_UNSPECIFIED;
}

absl::StatusOr<MessageKind> FromFrameKind(gpipe::v1::FrameKind k) {
  switch (k) {
    case gpipe::v1::ACTIVATION:
      return MessageKind::kActivation;
    case gpipe::v1::GRADIENT:
      return MessageKind::kGradient;
    case gpipe::v1::GRAD_SQUARES:
      return MessageKind::kGradSquares;
    case gpipe::v1::EVAL_END:
      return MessageKind::kEvalEnd;
    case gpipe::v1::EVAL_TAKEN:
      return MessageKind::kEvalTaken;
    case gpipe::v1::EVAL_FAILED:
      return MessageKind::kEvalFailed;
    case gpipe::v1::REDUCE_SLICE:
      return MessageKind::kReduceSlice;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("frame: kind ", static_cast<int>(k),
                       " cannot appear after the stream is open"));
  }
}

bool CarriesTensor(MessageKind k) {
  return k == MessageKind::kActivation || k == MessageKind::kGradient ||
         k == MessageKind::kReduceSlice;
}

}  // namespace

bool EncodeFrameFields(
    const Message& m, const std::string& job_id, int64_t epoch,
    const std::function<bool(const Frame&, int64_t, int64_t)>& emit,
    int64_t chunk_bytes) {
  Frame f;
  f.set_job_id(job_id);
  f.set_epoch(epoch);
  f.set_kind(ToFrameKind(m.kind));
  f.set_step(m.step);
  f.set_micro_batch(m.micro_batch);
  f.set_scalar(m.scalar);
  if (!CarriesTensor(m.kind) || !m.tensor.defined()) {
    f.set_last(true);
    return emit(f, 0, 0);
  }
  const Tensor& t = m.tensor;
  f.mutable_header()->set_dtype(t.dtype() == DType::kF32 ? gpipe::v1::FLOAT32
                                                         : gpipe::v1::INT32);
  for (int64_t d : t.shape().dims())
    f.mutable_header()->mutable_shape()->add_dims(d);
  const int64_t total = static_cast<int64_t>(t.nbytes());
  f.set_total_bytes(total);
  int64_t at = 0;
  do {
    const int64_t n = std::min(chunk_bytes, total - at);
    f.set_last(at + n == total);
    if (!emit(f, at, n)) return false;
    at += n;
    // Later chunks repeat only the routing fields.
    f.clear_header();
    f.clear_total_bytes();
  } while (at < total);
  return true;
}

bool EncodeFrames(const Message& m, const std::string& job_id, int64_t epoch,
                  const std::function<bool(const Frame&)>& emit) {
  Frame frame;
  return EncodeFrameFields(
      m, job_id, epoch, [&](const Frame& fields, int64_t at, int64_t n) {
        frame = fields;
        if (n > 0) {
          frame.set_payload(static_cast<const char*>(m.tensor.raw()) + at, n);
        }
        return emit(frame);
      });
}

absl::StatusOr<std::optional<Message>> FrameAssembler::Add(const Frame& f) {
  return Add(f, static_cast<int64_t>(f.payload().size()), [&](char* dst) {
    std::memcpy(dst, f.payload().data(), f.payload().size());
  });
}

absl::StatusOr<std::optional<Message>> FrameAssembler::Add(
    const ReceivedFrame& frame) {
  return Add(frame.fields(), frame.payload_size(),
             [&](char* dst) { frame.CopyPayload(dst); });
}

absl::StatusOr<std::optional<Message>> FrameAssembler::Add(
    const Frame& f, int64_t payload_size,
    const std::function<void(char* dst)>& copy_payload) {
  if (f.job_id() != job_id_ || f.epoch() != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "frame of job '", f.job_id(), "' epoch ", f.epoch(),
        " on a link of job '", job_id_, "' epoch ", epoch_, ": rejected"));
  }
  if (in_tensor_) {
    // Every chunk of a tensor carries its kind (a reduction slice's too).
    if (f.kind() != ToFrameKind(partial_.kind)) {
      return absl::InvalidArgumentError(
          "frame: a tensor's chunks were interrupted by another frame");
    }
    if (f.step() != partial_.step || f.micro_batch() != partial_.micro_batch) {
      return absl::InvalidArgumentError(absl::StrCat(
          "frame: chunk of micro-batch ", f.micro_batch(), " at step ",
          f.step(), " inside the tensor of micro-batch ", partial_.micro_batch,
          " at step ", partial_.step));
    }
  } else {
    absl::StatusOr<MessageKind> kind = FromFrameKind(f.kind());
    if (!kind.ok()) return kind.status();
    partial_ = Message();
    partial_.kind = *kind;
    partial_.step = f.step();
    partial_.micro_batch = f.micro_batch();
    partial_.scalar = f.scalar();
    if (!CarriesTensor(*kind)) {
      if (payload_size != 0 || !f.last()) {
        return absl::InvalidArgumentError(
            "frame: a scalar frame carries a payload or continues");
      }
      return std::optional<Message>(std::move(partial_));
    }
    const gpipe::v1::TensorHeader& h = f.header();
    if (h.dtype() != gpipe::v1::FLOAT32 && h.dtype() != gpipe::v1::INT32) {
      return absl::InvalidArgumentError(
          absl::StrCat("frame: tensor dtype ", static_cast<int>(h.dtype()),
                       " is not FLOAT32 or INT32"));
    }
    std::vector<int64_t> dims;
    int64_t numel = 1;
    for (int64_t d : h.shape().dims()) {
      if (d < 0 || (d > 0 && numel > kMaxTensorBytes / 4 / d)) {
        return absl::InvalidArgumentError(
            absl::StrCat("frame: tensor shape has a bad dimension ", d));
      }
      numel *= d;
      dims.push_back(d);
    }
    if (dims.empty()) {
      return absl::InvalidArgumentError("frame: tensor without a shape");
    }
    if (f.total_bytes() != numel * 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          "frame: header announces ", f.total_bytes(), " bytes but shape ",
          Shape(dims).ToString(), " needs ", numel * 4));
    }
    partial_.tensor = Tensor::Empty(Shape(dims), h.dtype() == gpipe::v1::FLOAT32
                                                     ? DType::kF32
                                                     : DType::kI32);
    expected_ = numel * 4;
    received_ = 0;
    in_tensor_ = true;
  }
  const int64_t n = payload_size;
  if (n > expected_ - received_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame: payload runs past the announced ", expected_, " bytes"));
  }
  if (n > 0)
    copy_payload(static_cast<char*>(partial_.tensor.raw()) + received_);
  received_ += n;
  if (!f.last()) return std::optional<Message>();
  if (received_ != expected_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "frame: tensor ended after ", received_, " of ", expected_, " bytes"));
  }
  in_tensor_ = false;
  return std::optional<Message>(std::move(partial_));
}

}  // namespace gpipe
