#include "services/transport/control_stream.h"

#include "services/transport/frame_wire.h"

namespace gpipe {

bool ControlStream::Write(const grpc::ByteBuffer& frame) {
  absl::MutexLock lock(&write_mu_);
  return stream_->Write(frame);
}

bool ControlStream::WriteFrame(const gpipe::v1::Frame& frame) {
  return Write(FrameToBuffer(frame));
}

bool ControlStream::WriteTogether(
    const std::function<bool(const FrameWriter&)>& write) {
  absl::MutexLock lock(&write_mu_);
  return write([this](const grpc::ByteBuffer& b) { return stream_->Write(b); });
}

void ControlStream::WritesDone() {
  absl::MutexLock lock(&write_mu_);
  stream_->WritesDone();
}

}  // namespace gpipe
