// The frames plane: tensor bytes inside Exchange frames (frame_wire.h),
// which works between any two hosts. Every link starts on it; the other
// planes leave it what they do not carry themselves.
#ifndef GPIPE_SERVICES_TRANSPORT_FRAME_DATA_PLANE_H_
#define GPIPE_SERVICES_TRANSPORT_FRAME_DATA_PLANE_H_

#include "services/transport/frame_codec.h"
#include "services/transport/plane.h"

namespace gpipe {

class FrameDataPlane final : public DataPlane {
 public:
  explicit FrameDataPlane(const PlaneContext& context)
      : context_(context), assembler_(context.job_id, context.epoch) {}

  DataPlaneKind kind() const override { return DataPlaneKind::kGrpc; }
  absl::Status Send(const Message& m) override;
  // Reassembles messages; a CUDA IPC descriptor or release is refused
  // (this link has no CUDA IPC plane). The reader thread's alone.
  absl::StatusOr<std::optional<Message>> OnFrame(
      const ReceivedFrame& frame) override;

 private:
  const PlaneContext& context_;
  FrameAssembler assembler_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_FRAME_DATA_PLANE_H_
