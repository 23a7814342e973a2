#include "services/transport/frame_data_plane.h"

namespace gpipe {

absl::Status FrameDataPlane::Send(const Message& m) {
  const bool ok = context_.control->WriteTogether([&](const FrameWriter& w) {
    return WriteFrames(m, context_.job_id, context_.epoch, context_.codec, w);
  });
  return ok ? absl::OkStatus() : absl::UnavailableError("the stream broke");
}

absl::StatusOr<std::optional<Message>> FrameDataPlane::OnFrame(
    const ReceivedFrame& frame) {
  const gpipe::v1::Frame& f = frame.fields();
  if (f.kind() == gpipe::v1::CUDA_IPC_RELEASE) {
    return absl::InvalidArgumentError(
        "frame: a CUDA IPC release on a link without CUDA IPC");
  }
  if (f.has_cuda_ipc_slot()) {
    return absl::InvalidArgumentError(
        "frame: a CUDA IPC descriptor on a link without CUDA IPC");
  }
  return assembler_.Add(frame);
}

}  // namespace gpipe
