// The shared-memory plane: messages in a segment both stages map
// (shm_channel.h), one copy end to end, no frame per chunk. A reader thread
// of its own moves the peer's messages from the segment into the link's
// inbox; the Exchange stream only negotiated it, and carries no messages
// once it is agreed (one there could overtake those in the segment).
#ifndef GPIPE_SERVICES_TRANSPORT_SHM_DATA_PLANE_H_
#define GPIPE_SERVICES_TRANSPORT_SHM_DATA_PLANE_H_

#include <memory>
#include <thread>

#include "services/transport/plane.h"
#include "services/transport/shm_channel.h"

namespace gpipe {

class ShmDataPlane final : public DataPlane {
 public:
  // Starts the reader thread.
  ShmDataPlane(const PlaneContext& context,
               std::shared_ptr<ShmChannel> channel);
  ~ShmDataPlane() override;  // Stop(CANCELLED "link destroyed")

  DataPlaneKind kind() const override { return DataPlaneKind::kShm; }
  absl::Status Send(const Message& m) override;
  // Every message frame is refused: messages travel in the segment.
  absl::StatusOr<std::optional<Message>> OnFrame(
      const ReceivedFrame& frame) override;
  int64_t mapped_bytes() const override { return channel_->segment_bytes(); }
  void Close(const absl::Status& why) override;
  void Stop(const absl::Status& why, bool drain) override;

 private:
  // The peer's messages out of the segment into the inbox until the
  // channel closes; a chunk that fails a check fails the link.
  void ReadLoop();

  const PlaneContext& context_;
  const std::shared_ptr<ShmChannel> channel_;
  std::thread reader_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_SHM_DATA_PLANE_H_
