// Exchange frames <-> the gRPC byte buffers that carry them, with as few
// copies of the payload as the wire allows. The bytes are exactly those of a
// serialized gpipe.v1.Frame, so either end may be any protobuf peer:
//  - sending: the small fields are serialized by protobuf, followed by field 8
//    (`payload`) whose bytes are a slice pointing into the tensor itself; the
//    slice keeps the tensor alive until gRPC lets go of it (no copy);
//  - receiving: the fields other than the payload are parsed with protobuf,
//    the payload is located in gRPC's slices and copied once, straight into
//    the destination tensor (FrameAssembler).
// The copying codec (protobuf's own serialization through a Frame with its
// payload in a std::string) stays for comparison (stream_bench) and for any
// peer that wants it.
#ifndef GPIPE_SERVICES_TRANSPORT_FRAME_WIRE_H_
#define GPIPE_SERVICES_TRANSPORT_FRAME_WIRE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gpipe/v1/stage.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "services/transport/link.h"

namespace gpipe {

enum class FrameCodec : uint8_t {
  kZeroCopy,  // payload sent from the tensor, received with one copy
  // Payload copied once into a slice that gRPC owns, received with one copy.
  // Send returns without waiting for gRPC to let go of the tensor: on a
  // synchronous client stream that release waits for the call to be polled
  // again, about 13 ms when the stage goes back to computing after a send.
  kOneCopy,
  kCopying,  // through Frame.payload strings (4 copies per byte in all)
};

// Fields other than the payload may take at most this many bytes in one
// frame (a header of a rank-1000 tensor fits many times over).
inline constexpr size_t kMaxFrameFieldBytes = 64 << 10;

// One frame as it arrived: its fields (payload left empty) and where its
// payload lies in the buffer's slices.
class ReceivedFrame {
 public:
  const gpipe::v1::Frame& fields() const { return fields_; }
  int64_t payload_size() const { return static_cast<int64_t>(payload_size_); }
  // Copies the payload to `dst` (payload_size() bytes).
  void CopyPayload(char* dst) const;

 private:
  friend absl::Status DecodeFrame(const grpc::ByteBuffer& buffer,
                                  ReceivedFrame* frame);
  friend absl::Status DecodeFrameCopying(const grpc::ByteBuffer& buffer,
                                         ReceivedFrame* frame);
  gpipe::v1::Frame fields_;
  std::vector<grpc::Slice> slices_;
  size_t payload_at_ = 0, payload_size_ = 0;
  // Copying codec: the payload parsed into a string.
  std::string payload_;
  bool payload_in_string_ = false;
};

// Parses a serialized Frame without copying its payload. Malformed bytes
// (truncated varints, lengths past the end, wire types a Frame cannot have,
// oversize fields) give INVALID_ARGUMENT naming what is wrong.
absl::Status DecodeFrame(const grpc::ByteBuffer& buffer, ReceivedFrame* frame);
// The same through protobuf's parser (the payload lands in a string first).
absl::Status DecodeFrameCopying(const grpc::ByteBuffer& buffer,
                                ReceivedFrame* frame);

// Calls `write` with each frame of `m` as a byte buffer, in order; stops at
// the first false (which this returns). With kZeroCopy the payload slices
// point into m.tensor; before returning, this waits until gRPC has released
// them (it does so when each write completes), so the caller may reuse or
// free the tensor and its allocator afterwards. Should gRPC still hold a
// slice (a failed stream), that tensor is left allocated rather than freed
// behind the caller's back.
bool WriteFrames(const Message& m, const std::string& job_id, int64_t epoch,
                 FrameCodec codec,
                 const std::function<bool(const grpc::ByteBuffer&)>& write);

// A serialized Frame (e.g. OPEN) as one byte buffer.
grpc::ByteBuffer FrameToBuffer(const gpipe::v1::Frame& frame);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_FRAME_WIRE_H_
