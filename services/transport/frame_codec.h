// Messages <-> Exchange frames. A tensor travels as one or more frames of at
// most kMaxChunkBytes payload; the first carries its header and total size.
// The reassembler checks every frame against the link's job and epoch
// (fencing) and every header against its byte count, so a stale worker or a
// corrupt peer is rejected with a clear status instead of crashing anyone.
#ifndef GPIPE_SERVICES_TRANSPORT_FRAME_CODEC_H_
#define GPIPE_SERVICES_TRANSPORT_FRAME_CODEC_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpipe/v1/stage.pb.h"
#include "services/transport/frame_wire.h"
#include "services/transport/link.h"

namespace gpipe {

inline constexpr int64_t kMaxChunkBytes = 1 << 20;
// Largest tensor a frame sequence may announce (2 GiB): a garbage header
// cannot make the receiver allocate more.
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 31;

// Calls `emit` with each frame of `m` in order (stops at the first false,
// which this returns).
bool EncodeFrames(const Message& m, const std::string& job_id, int64_t epoch,
                  const std::function<bool(const gpipe::v1::Frame&)>& emit);
// The same frames without their payloads: `emit` gets each frame's fields
// and the byte range [at, at + n) of m.tensor that is its payload, in chunks
// of at most `chunk_bytes` (the shared-memory plane uses larger ones).
bool EncodeFrameFields(const Message& m, const std::string& job_id,
                       int64_t epoch,
                       const std::function<bool(const gpipe::v1::Frame&,
                                                int64_t at, int64_t n)>& emit,
                       int64_t chunk_bytes = kMaxChunkBytes);

class FrameAssembler {
 public:
  FrameAssembler(std::string job_id, int64_t epoch)
      : job_id_(std::move(job_id)), epoch_(epoch) {}
  // Feeds one frame. Returns a complete message when `frame` ends one,
  // nullopt while a tensor is still arriving, or an error naming what is
  // wrong (FAILED_PRECONDITION for another job or epoch, INVALID_ARGUMENT for
  // a malformed frame).
  absl::StatusOr<std::optional<Message>> Add(const gpipe::v1::Frame& frame);
  // The same for a frame decoded from the wire: its payload is copied once,
  // from gRPC's slices into the tensor being assembled.
  absl::StatusOr<std::optional<Message>> Add(const ReceivedFrame& frame);
  // The same for a frame whose payload lies elsewhere (the shared-memory
  // plane): `copy_payload` copies its `payload_size` bytes to `dst`, and is
  // called only once the frame passed every check.
  absl::StatusOr<std::optional<Message>> Add(
      const gpipe::v1::Frame& fields, int64_t payload_size,
      const std::function<void(char* dst)>& copy_payload);

 private:
  std::string job_id_;
  int64_t epoch_;
  bool in_tensor_ = false;
  Message partial_;
  int64_t expected_ = 0;
  int64_t received_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_FRAME_CODEC_H_
