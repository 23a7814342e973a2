// One data plane of a link: how a message's tensor bytes reach the peer
// (frames on the Exchange stream, a shared-memory segment, or a device
// buffer through CUDA IPC). The link (exchange_link.h) sends through the
// plane it and its peer agreed on (plane_negotiator.h) and hands it the
// stream's frames that belong to it; each plane is tested on its own.
#ifndef GPIPE_SERVICES_TRANSPORT_PLANE_H_
#define GPIPE_SERVICES_TRANSPORT_PLANE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "services/transport/control_stream.h"
#include "services/transport/data_plane.h"
#include "services/transport/frame_wire.h"
#include "services/transport/link.h"
#include "services/transport/message_queue.h"

namespace gpipe {

// What a plane needs of the link it serves. All pointers outlive the plane.
struct PlaneContext {
  std::string job_id;
  int64_t epoch = 0;
  ControlStream* control = nullptr;  // descriptors, releases, frames
  MessageQueue* inbox = nullptr;     // where received messages go
  FrameCodec codec = FrameCodec::kZeroCopy;
  // A plane whose own reader thread finds a bad chunk fails the link with
  // it (the link then closes its inbox and, at the client's end, cancels
  // the stream).
  std::function<void(const absl::Status&)> fail;
};

class DataPlane {
 public:
  virtual ~DataPlane() = default;
  virtual DataPlaneKind kind() const = 0;

  // Sends `m` to the peer, blocking while the plane is full
  // (back-pressure). UNAVAILABLE or CANCELLED once the link is gone;
  // another code when the message cannot travel on this plane.
  virtual absl::Status Send(const Message& m) = 0;

  // A frame of the Exchange stream that is no negotiation and passed the
  // link's fencing, on the reader thread: a message when it completes one.
  // An error rejects the frame and fails the link.
  virtual absl::StatusOr<std::optional<Message>> OnFrame(
      const ReceivedFrame& frame) = 0;

  // On the receiving stage's thread: fills in the tensor of a message the
  // plane queued without it (CUDA IPC queues the message with its first
  // chunk and copies the chunks out here, so a tensor larger than the ring
  // flows through it).
  virtual absl::Status ReceiveTensor(Message& m) {
    return absl::InternalError(
        absl::StrCat(Describe(m), " arrived without its tensor"));
  }

  // Whether Send takes device tensors as they are and received messages
  // hold device tensors.
  virtual bool CarriesDeviceTensors() const { return false; }

  // Host memory the plane maps beside the link's messages (a shared-memory
  // segment), which the worker's memory for stages must leave room for.
  virtual int64_t mapped_bytes() const { return 0; }

  // Wakes and fails every blocked and later call with `why`; returns at
  // once (any thread).
  virtual void Close(const absl::Status& why) {}
  // Ends the plane and waits until nothing of it runs any more; with
  // `drain`, what the peer already posted reaches the inbox first. Not from
  // the plane's own threads.
  virtual void Stop(const absl::Status& why, bool drain) { Close(why); }
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_PLANE_H_
