#include "services/transport/shm_data_plane.h"

#include "services/transport/frame_codec.h"
#include "services/transport/shm_messages.h"

namespace gpipe {

ShmDataPlane::ShmDataPlane(const PlaneContext& context,
                           std::shared_ptr<ShmChannel> channel)
    : context_(context), channel_(std::move(channel)) {
  reader_ = std::thread([this] { ReadLoop(); });
}

ShmDataPlane::~ShmDataPlane() {
  Stop(absl::CancelledError("link destroyed"), /*drain=*/false);
}

absl::Status ShmDataPlane::Send(const Message& m) {
  return WriteShmMessage(m, context_.job_id, context_.epoch, *channel_);
}

absl::StatusOr<std::optional<Message>> ShmDataPlane::OnFrame(
    const ReceivedFrame&) {
  return absl::InvalidArgumentError(
      "frame: a message in a frame on a link whose messages travel in "
      "shared memory");
}

void ShmDataPlane::Close(const absl::Status& why) {
  channel_->Close(why, /*drain=*/false);
}

void ShmDataPlane::Stop(const absl::Status& why, bool drain) {
  channel_->Close(why, drain);
  if (reader_.joinable() && reader_.get_id() != std::this_thread::get_id()) {
    reader_.join();
  }
}

void ShmDataPlane::ReadLoop() {
  FrameAssembler assembler(context_.job_id, context_.epoch);
  absl::Status rejected;
  for (;;) {
    absl::StatusOr<std::optional<ShmChunk>> chunk = channel_->Next();
    if (!chunk.ok()) {
      rejected = chunk.status();  // a chunk that failed a check
      break;
    }
    if (!chunk->has_value()) break;  // closed: the stream or Close says why
    absl::StatusOr<std::optional<Message>> m =
        ReadShmChunk(channel_, **chunk, assembler);
    if (!m.ok()) {
      rejected = m.status();
      break;
    }
    if (m->has_value() && !context_.inbox->Push(std::move(**m)).ok()) break;
  }
  if (rejected.ok()) return;
  // Fail the link at once: the stage's Receive and Send see the reason.
  channel_->Close(rejected, /*drain=*/false);
  context_.fail(rejected);
}

}  // namespace gpipe
