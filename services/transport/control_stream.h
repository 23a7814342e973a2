// The Exchange stream under a link between two neighbouring stages: one
// gRPC stream of serialized gpipe.v1.Frame messages (frame_wire.h). Every
// data plane rides on it: OPEN, the plane negotiation, CUDA IPC descriptors
// and releases, and on the frames plane the messages themselves. Writes
// from any thread are serialized; one reader thread reads.
#ifndef GPIPE_SERVICES_TRANSPORT_CONTROL_STREAM_H_
#define GPIPE_SERVICES_TRANSPORT_CONTROL_STREAM_H_

#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gpipe/v1/stage.pb.h"
#include "grpcpp/support/byte_buffer.h"

namespace gpipe {

// The two kinds of gRPC stream under a link (the client's and the
// server's end), each message one serialized Frame.
class FrameStream {
 public:
  virtual ~FrameStream() = default;
  virtual bool Read(grpc::ByteBuffer* frame) = 0;
  virtual bool Write(const grpc::ByteBuffer& frame) = 0;
  // Makes pending and future Read/Write calls fail.
  virtual void Cancel() = 0;
  // The client's end: half-close, then wait for the server's status.
  virtual void WritesDone() {}
  virtual void Finish() {}
};

// Writes one serialized frame; false once the stream is broken.
using FrameWriter = std::function<bool(const grpc::ByteBuffer&)>;

class ControlStream {
 public:
  explicit ControlStream(std::unique_ptr<FrameStream> stream)
      : stream_(std::move(stream)) {}

  // The reader thread's alone.
  bool Read(grpc::ByteBuffer* frame) { return stream_->Read(frame); }

  bool Write(const grpc::ByteBuffer& frame) ABSL_LOCKS_EXCLUDED(write_mu_);
  bool WriteFrame(const gpipe::v1::Frame& frame) ABSL_LOCKS_EXCLUDED(write_mu_);
  // Runs `write` with the stream to itself: the frames it writes through
  // the writer it is given (one message's) are not interleaved with others.
  bool WriteTogether(const std::function<bool(const FrameWriter&)>& write)
      ABSL_LOCKS_EXCLUDED(write_mu_);

  void Cancel() { stream_->Cancel(); }
  // The client's end: no more writes, then the server's final status.
  void WritesDone() ABSL_LOCKS_EXCLUDED(write_mu_);
  void Finish() { stream_->Finish(); }

 private:
  const std::unique_ptr<FrameStream> stream_;
  absl::Mutex write_mu_;  // one write at a time
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_CONTROL_STREAM_H_
