#include "services/transport/frame_wire.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "services/transport/frame_codec.h"

namespace gpipe {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using gpipe::v1::Frame;

// Field 8 (`payload`), wire type 2 (length-delimited).
constexpr uint8_t kPayloadTag = (8 << 3) | 2;
// Payloads this small are copied next to the fields: a slice of its own
// costs more than copying them.
constexpr int64_t kInlinePayloadBytes = 4 << 10;
// How long a sender waits for gRPC to release a written payload before it
// leaves the tensor to gRPC (only a failed stream holds on to one).
constexpr auto kReleaseWait = std::chrono::seconds(5);

// A protobuf input stream over gRPC's slices, read in place.
class SliceInputStream final
    : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit SliceInputStream(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {}

  bool Next(const void** data, int* size) override {
    while (index_ < slices_.size()) {
      const grpc::Slice& s = slices_[index_];
      if (offset_ < s.size()) {
        *data = s.begin() + offset_;
        *size = static_cast<int>(s.size() - offset_);
        offset_ = s.size();
        count_ += *size;
        return true;
      }
      ++index_;
      offset_ = 0;
    }
    return false;
  }
  void BackUp(int count) override {
    offset_ -= static_cast<size_t>(count);
    count_ -= count;
  }
  bool Skip(int count) override {
    while (count > 0) {
      const void* data;
      int size;
      if (!Next(&data, &size)) return false;
      if (size > count) {
        BackUp(size - count);
        return true;
      }
      count -= size;
    }
    return true;
  }
  int64_t ByteCount() const override { return count_; }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0, offset_ = 0;
  int64_t count_ = 0;
};

// Copies bytes [at, at + n) of the concatenated slices to `dst`.
void CopyOut(const std::vector<grpc::Slice>& slices, size_t at, size_t n,
             char* dst) {
  for (const grpc::Slice& s : slices) {
    if (n == 0) return;
    if (at >= s.size()) {
      at -= s.size();
      continue;
    }
    const size_t k = std::min(n, s.size() - at);
    std::memcpy(dst, s.begin() + at, k);
    dst += k;
    n -= k;
    at = 0;
  }
}

absl::Status Malformed(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("frame: ", what));
}

// Who waits for the payload slices of one message, and whether they were
// given up on.
struct PinState {
  std::mutex mu;
  std::condition_variable released;
  int held = 0;
  bool abandoned = false;
};

// One payload slice's hold on its tensor.
struct Pin {
  std::shared_ptr<PinState> state;
  Tensor tensor;
};

// gRPC's destroy callback of a payload slice (any thread).
void ReleasePin(void* p) {
  Pin* pin = static_cast<Pin*>(p);
  std::shared_ptr<PinState> state = std::move(pin->state);
  std::lock_guard<std::mutex> lock(state->mu);
  // An abandoned tensor stays allocated: its allocator may be gone by now.
  if (!state->abandoned) delete pin;
  --state->held;
  state->released.notify_all();
}

// The serialized fields, then (when `n` > 0) the payload field's tag and
// length: everything of a frame but its payload bytes.
std::string FieldsAndPayloadTag(const Frame& fields, int64_t n) {
  std::string head;
  fields.SerializeToString(&head);
  if (n == 0) return head;
  uint8_t prefix[1 + 5];  // the tag and a varint32 of at most 5 bytes
  prefix[0] = kPayloadTag;
  const uint8_t* end = CodedOutputStream::WriteVarint32ToArray(
      static_cast<uint32_t>(n), prefix + 1);
  head.append(reinterpret_cast<const char*>(prefix), end - prefix);
  return head;
}

grpc::ByteBuffer ZeroCopyFrame(const Frame& fields, const Tensor& tensor,
                               int64_t at, int64_t n,
                               const std::shared_ptr<PinState>& state) {
  std::string head = FieldsAndPayloadTag(fields, n);
  if (n == 0) {  // no tensor, or an empty one
    grpc::Slice slice(head);
    return grpc::ByteBuffer(&slice, 1);
  }
  const char* payload = static_cast<const char*>(tensor.raw()) + at;
  if (n <= kInlinePayloadBytes) {
    head.append(payload, n);
    grpc::Slice slice(head);
    return grpc::ByteBuffer(&slice, 1);
  }
  {
    std::lock_guard<std::mutex> lock(state->mu);
    ++state->held;
  }
  grpc::Slice slices[2] = {
      grpc::Slice(head),
      grpc::Slice(const_cast<char*>(payload), static_cast<size_t>(n),
                  &ReleasePin, new Pin{state, tensor})};
  return grpc::ByteBuffer(slices, 2);
}

// The whole frame in one slice that gRPC owns: the payload copied once.
grpc::ByteBuffer OneCopyFrame(const Frame& fields, const Tensor& tensor,
                              int64_t at, int64_t n) {
  const std::string head = FieldsAndPayloadTag(fields, n);
  grpc::Slice slice(head.size() + static_cast<size_t>(n));
  // A fresh slice is ours alone until it is handed to the ByteBuffer.
  char* out = reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()));
  std::memcpy(out, head.data(), head.size());
  if (n > 0) {
    std::memcpy(out + head.size(), static_cast<const char*>(tensor.raw()) + at,
                static_cast<size_t>(n));
  }
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

void ReceivedFrame::CopyPayload(char* dst) const {
  if (payload_in_string_) {
    std::memcpy(dst, payload_.data(), payload_.size());
  } else {
    CopyOut(slices_, payload_at_, payload_size_, dst);
  }
}

absl::Status DecodeFrame(const grpc::ByteBuffer& buffer, ReceivedFrame* frame) {
  frame->fields_.Clear();
  frame->slices_.clear();
  frame->payload_.clear();
  frame->payload_in_string_ = false;
  frame->payload_at_ = frame->payload_size_ = 0;
  if (!buffer.Valid()) return Malformed("an empty message");
  if (!buffer.Dump(&frame->slices_).ok()) {
    return Malformed("cannot read the message's bytes");
  }
  size_t total = 0;
  for (const grpc::Slice& s : frame->slices_) total += s.size();

  // Walk the fields; keep the bytes of all but the payload for protobuf.
  std::string fields;
  bool have_payload = false;
  SliceInputStream stream(frame->slices_);
  CodedInputStream in(&stream);
  for (;;) {
    const size_t start = static_cast<size_t>(in.CurrentPosition());
    if (start >= total) break;
    const uint32_t tag = in.ReadTag();
    const uint32_t field = tag >> 3, type = tag & 7;
    if (field == 0) {
      return Malformed(absl::StrCat("no valid field tag at byte ", start));
    }
    if (field == 8 && type != 2) {
      return Malformed(absl::StrCat("payload (field 8) has wire type ", type,
                                    ", not length-delimited"));
    }
    switch (type) {
      case 0: {
        uint64_t v;
        if (!in.ReadVarint64(&v)) {
          return Malformed(absl::StrCat("truncated varint in field ", field,
                                        " at byte ", start));
        }
        break;
      }
      case 1:
      case 5:
        if (!in.Skip(type == 1 ? 8 : 4)) {
          return Malformed(absl::StrCat("field ", field, " at byte ", start,
                                        " runs past the end"));
        }
        break;
      case 2: {
        uint32_t len;
        if (!in.ReadVarint32(&len)) {
          return Malformed(absl::StrCat("truncated length of field ", field,
                                        " at byte ", start));
        }
        const size_t at = static_cast<size_t>(in.CurrentPosition());
        if (len > total - at) {
          return Malformed(absl::StrCat("field ", field, " announces ", len,
                                        " bytes but only ", total - at,
                                        " remain"));
        }
        if (!in.Skip(static_cast<int>(len))) {
          return Malformed(absl::StrCat("field ", field, " runs past the end"));
        }
        if (field == 8) {
          if (have_payload) return Malformed("payload appears twice");
          have_payload = true;
          frame->payload_at_ = at;
          frame->payload_size_ = len;
          continue;
        }
        break;
      }
      default:
        return Malformed(absl::StrCat("field ", field, " has wire type ", type,
                                      ", which no Frame field has"));
    }
    const size_t end = static_cast<size_t>(in.CurrentPosition());
    if (fields.size() + (end - start) > kMaxFrameFieldBytes) {
      return Malformed(absl::StrCat("fields other than the payload exceed ",
                                    kMaxFrameFieldBytes, " bytes"));
    }
    const size_t old = fields.size();
    fields.resize(old + (end - start));
    CopyOut(frame->slices_, start, end - start, fields.data() + old);
  }
  if (!frame->fields_.ParseFromString(fields)) {
    return Malformed(
        "its fields do not parse as gpipe.v1.Frame (a bad tensor header or a "
        "job id that is not UTF-8)");
  }
  return absl::OkStatus();
}

absl::Status DecodeFrameCopying(const grpc::ByteBuffer& buffer,
                                ReceivedFrame* frame) {
  frame->slices_.clear();
  frame->payload_at_ = frame->payload_size_ = 0;
  frame->payload_in_string_ = true;
  if (!buffer.Valid()) return Malformed("an empty message");
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) {
    return Malformed("cannot read the message's bytes");
  }
  SliceInputStream stream(slices);
  if (!frame->fields_.ParseFromZeroCopyStream(&stream)) {
    return Malformed("its bytes do not parse as gpipe.v1.Frame");
  }
  frame->payload_ = std::move(*frame->fields_.mutable_payload());
  frame->fields_.clear_payload();
  frame->payload_size_ = frame->payload_.size();
  return absl::OkStatus();
}

grpc::ByteBuffer FrameToBuffer(const Frame& frame) {
  grpc::Slice slice(frame.ByteSizeLong());
  frame.SerializeWithCachedSizesToArray(const_cast<uint8_t*>(slice.begin()));
  return grpc::ByteBuffer(&slice, 1);
}

bool WriteFrames(const Message& m, const std::string& job_id, int64_t epoch,
                 FrameCodec codec,
                 const std::function<bool(const grpc::ByteBuffer&)>& write) {
  if (codec == FrameCodec::kCopying) {
    return EncodeFrames(m, job_id, epoch, [&](const Frame& f) {
      return write(FrameToBuffer(f));
    });
  }
  if (codec == FrameCodec::kOneCopy) {
    return EncodeFrameFields(
        m, job_id, epoch, [&](const Frame& fields, int64_t at, int64_t n) {
          return write(OneCopyFrame(fields, m.tensor, at, n));
        });
  }
  auto state = std::make_shared<PinState>();
  const bool ok = EncodeFrameFields(
      m, job_id, epoch, [&](const Frame& fields, int64_t at, int64_t n) {
        return write(ZeroCopyFrame(fields, m.tensor, at, n, state));
      });
  // gRPC drops its references when each write completes; wait for that, so
  // the tensor is the caller's alone again once this returns.
  std::unique_lock<std::mutex> lock(state->mu);
  if (!state->released.wait_for(lock, ok ? kReleaseWait : kReleaseWait / 50,
                                [&] { return state->held == 0; })) {
    state->abandoned = true;
  }
  return ok;
}

}  // namespace gpipe
