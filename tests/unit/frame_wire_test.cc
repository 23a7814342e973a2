// Frames on the wire: the zero-copy codec writes bytes any protobuf peer
// reads as gpipe.v1.Frame and reads what protobuf writes, tensors survive
// the trip bit for bit, and malformed, truncated or random bytes get a clear
// INVALID_ARGUMENT, never a crash.
#include "services/transport/frame_wire.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/transport/frame_codec.h"

namespace gpipe {
namespace {

using gpipe::v1::Frame;
using ::testing::HasSubstr;

constexpr char kJob[] = "job-wire";
constexpr int64_t kEpoch = 3;

// The bytes of `buffer`, concatenated.
std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// `bytes` as a byte buffer cut into slices at `cuts` (ascending offsets).
grpc::ByteBuffer Buffer(const std::string& bytes,
                        const std::vector<size_t>& cuts = {}) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t cut : cuts) {
    if (cut <= at || cut >= bytes.size()) continue;
    slices.emplace_back(bytes.data() + at, cut - at);
    at = cut;
  }
  slices.emplace_back(bytes.data() + at, bytes.size() - at);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

Tensor Pattern(int64_t n) {
  Tensor t = Tensor::Empty(Shape({n}));
  for (int64_t i = 0; i < n; ++i) t.f32()[i] = static_cast<float>(i) * 0.5f;
  return t;
}

Message Activation(Tensor t) {
  Message m;
  m.kind = MessageKind::kActivation;
  m.step = 7;
  m.micro_batch = 2;
  m.tensor = std::move(t);
  return m;
}

// The frames of `m` as the sender writes them with `codec`.
std::vector<std::string> Encode(const Message& m, FrameCodec codec) {
  std::vector<std::string> frames;
  EXPECT_TRUE(
      WriteFrames(m, kJob, kEpoch, codec, [&](const grpc::ByteBuffer& b) {
        frames.push_back(Bytes(b));
        return true;
      }));
  return frames;
}

// Decodes and assembles `frames`; the message they make up.
absl::StatusOr<Message> Assemble(const std::vector<std::string>& frames,
                                 FrameCodec codec) {
  FrameAssembler assembler(kJob, kEpoch);
  ReceivedFrame frame;
  for (size_t i = 0; i < frames.size(); ++i) {
    const grpc::ByteBuffer buffer = Buffer(frames[i], {1, 7, 100, 5000});
    absl::Status s = codec == FrameCodec::kCopying
                         ? DecodeFrameCopying(buffer, &frame)
                         : DecodeFrame(buffer, &frame);
    if (!s.ok()) return s;
    absl::StatusOr<std::optional<Message>> m = assembler.Add(frame);
    if (!m.ok()) return m.status();
    if (m->has_value()) {
      if (i + 1 != frames.size()) {
        return absl::InternalError("message ended before its last frame");
      }
      return std::move(**m);
    }
  }
  return absl::InternalError("no message");
}

TEST(FrameWireTest, ZeroCopyFramesAreProtobufFramesAndRoundTrip) {
  // 2.5 MiB: three chunks, the last one partial.
  const Tensor t = Pattern((5 << 20) / 8);
  const std::vector<std::string> frames =
      Encode(Activation(t), FrameCodec::kZeroCopy);
  ASSERT_EQ(frames.size(), 3u);
  std::string payload;
  for (size_t i = 0; i < frames.size(); ++i) {
    Frame f;
    ASSERT_TRUE(f.ParseFromString(frames[i])) << "frame " << i;
    EXPECT_EQ(f.job_id(), kJob);
    EXPECT_EQ(f.epoch(), kEpoch);
    EXPECT_EQ(f.kind(), gpipe::v1::ACTIVATION);
    EXPECT_EQ(f.step(), 7);
    EXPECT_EQ(f.micro_batch(), 2);
    EXPECT_EQ(f.last(), i + 1 == frames.size());
    EXPECT_EQ(f.has_header(), i == 0);
    payload += f.payload();
  }
  ASSERT_EQ(payload.size(), t.nbytes());
  EXPECT_EQ(std::memcmp(payload.data(), t.raw(), t.nbytes()), 0);

  for (FrameCodec codec : {FrameCodec::kZeroCopy, FrameCodec::kCopying}) {
    absl::StatusOr<Message> m = Assemble(frames, codec);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(BitwiseEqual(m->tensor, t));
    EXPECT_EQ(m->step, 7);
    EXPECT_EQ(m->micro_batch, 2);
  }
}

// A replica's gradient slice larger than one frame travels in chunks like
// an activation (a replica of a deep MLP failed at its first reduction when
// the assembler took only activation and gradient chunks); a chunk of
// another kind inside it is refused.
TEST(FrameWireTest, AReductionSliceRoundTripsInChunks) {
  const Tensor t = Pattern((5 << 20) / 8);
  Message slice = Activation(t);
  slice.kind = MessageKind::kReduceSlice;
  const std::vector<std::string> frames = Encode(slice, FrameCodec::kZeroCopy);
  ASSERT_EQ(frames.size(), 3u);
  for (FrameCodec codec : {FrameCodec::kZeroCopy, FrameCodec::kCopying}) {
    absl::StatusOr<Message> m = Assemble(frames, codec);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->kind, MessageKind::kReduceSlice);
    EXPECT_TRUE(BitwiseEqual(m->tensor, t));
  }
  std::vector<std::string> mixed = frames;
  mixed[1] = Encode(Activation(t), FrameCodec::kZeroCopy)[1];
  absl::StatusOr<Message> m = Assemble(mixed, FrameCodec::kZeroCopy);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("interrupted by another frame"));
}

TEST(FrameWireTest, TheZeroCopyDecoderReadsProtobufsOwnFrames) {
  for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{300000}}) {
    const Tensor t = Pattern(n);
    const std::vector<std::string> frames =
        Encode(Activation(t), FrameCodec::kCopying);
    absl::StatusOr<Message> m = Assemble(frames, FrameCodec::kZeroCopy);
    ASSERT_TRUE(m.ok()) << n << ": " << m.status();
    EXPECT_TRUE(BitwiseEqual(m->tensor, t)) << n;
  }
  Message scalar;
  scalar.kind = MessageKind::kGradSquares;
  scalar.step = 4;
  scalar.scalar = 2.25;
  absl::StatusOr<Message> m =
      Assemble(Encode(scalar, FrameCodec::kZeroCopy), FrameCodec::kZeroCopy);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kind, MessageKind::kGradSquares);
  EXPECT_EQ(m->scalar, 2.25);
  EXPECT_FALSE(m->tensor.defined());
}

// The evaluation's control messages carry their batch (or, for a failure,
// the stage whose part failed) in micro_batch, and no tensor, under both
// codecs.
TEST(FrameWireTest, TheEvaluationsControlMessagesRoundTrip) {
  for (MessageKind kind : {MessageKind::kEvalEnd, MessageKind::kEvalTaken,
                           MessageKind::kEvalFailed}) {
    Message sent;
    sent.kind = kind;
    sent.step = kEvalStep;
    sent.micro_batch = 5;
    for (FrameCodec codec : {FrameCodec::kZeroCopy, FrameCodec::kCopying}) {
      absl::StatusOr<Message> m = Assemble(Encode(sent, codec), codec);
      ASSERT_TRUE(m.ok()) << Describe(sent) << ": " << m.status();
      EXPECT_EQ(m->kind, kind) << Describe(sent);
      EXPECT_EQ(m->step, kEvalStep);
      EXPECT_EQ(m->micro_batch, 5) << Describe(sent);
      EXPECT_FALSE(m->tensor.defined());
    }
  }
}

TEST(FrameWireTest, TheSenderOwnsItsTensorAgainWhenWriteFramesReturns) {
  CpuAllocator host;
  CountingAllocator counting(&host);
  {
    AllocatorScope scope(&counting);
    const Message m = Activation(Pattern(1 << 20));  // 4 MiB: 4 frames
    int written = 0;
    ASSERT_TRUE(WriteFrames(m, kJob, kEpoch, FrameCodec::kZeroCopy,
                            [&](const grpc::ByteBuffer& b) {
                              ++written;
                              return b.Length() > kMaxChunkBytes;
                            }));
    EXPECT_EQ(written, 4);
    EXPECT_EQ(counting.current_bytes(), 4 << 20);
  }
  // Dropping the message freed its tensor: no payload slice still holds it.
  EXPECT_EQ(counting.current_bytes(), 0);
}

TEST(FrameWireTest, OneCopyFramesAreTheZeroCopyBytesAndHoldNoTensor) {
  // Empty, inline-sized, one slice's worth and several chunks.
  for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{4096}, int64_t{300000},
                    int64_t{(5 << 20) / 8}}) {
    const Tensor expected = Pattern(n);
    const std::vector<std::string> zero =
        Encode(Activation(expected), FrameCodec::kZeroCopy);
    CpuAllocator host;
    CountingAllocator counting(&host);
    std::vector<grpc::ByteBuffer> held;  // as gRPC may, after Send returned
    std::vector<std::string> one;
    {
      AllocatorScope scope(&counting);
      const Message m = Activation(Pattern(n));
      ASSERT_TRUE(WriteFrames(m, kJob, kEpoch, FrameCodec::kOneCopy,
                              [&](const grpc::ByteBuffer& b) {
                                held.push_back(b);
                                one.push_back(Bytes(b));
                                return true;
                              }));
    }
    // The message is gone while its frames live on: they own their bytes.
    EXPECT_EQ(counting.current_bytes(), 0) << n;
    EXPECT_EQ(one, zero) << n;
    absl::StatusOr<Message> back = Assemble(one, FrameCodec::kOneCopy);
    ASSERT_TRUE(back.ok()) << n << ": " << back.status();
    EXPECT_TRUE(BitwiseEqual(back->tensor, expected)) << n;
  }
}

absl::Status DecodeBytes(const std::string& bytes) {
  ReceivedFrame frame;
  return DecodeFrame(Buffer(bytes), &frame);
}

TEST(FrameWireTest, MalformedBytesAreRejectedWithTheReason) {
  struct Case {
    std::string bytes, reason;
  };
  const std::string big_job = "\x0a\x80\x80\x05" + std::string(80 << 10, 'j');
  const Case cases[] = {
      {std::string("\x10\xff\xff", 3), "truncated varint in field 2"},
      {std::string("\x0a\x10"
                   "ab",
                   4),
       "field 1 announces 16 bytes but only 2"},
      {std::string("\x42\xff\xff\xff\xff\x0f", 6), "field 8 announces"},
      {std::string("\x42\xff", 2), "truncated length of field 8"},
      {std::string("\x40\x01", 2), "payload (field 8) has wire type 0"},
      {std::string("\x0b\x0c", 2), "field 1 has wire type 3"},
      {std::string("\x0e", 1), "field 1 has wire type 6"},
      {std::string("\x00\x01", 2), "no valid field tag at byte 0"},
      {std::string("\x42\x01x\x42\x01y", 6), "payload appears twice"},
      {std::string("\x51\x01\x02", 3), "field 10 at byte 0 runs past the end"},
      {std::string("\x0a\x02\xff\xfe", 4), "do not parse as gpipe.v1.Frame"},
      {std::string("\x32\x02\x08", 3), "field 6 announces 2 bytes but only 1"},
      {big_job, "exceed 65536 bytes"},
  };
  for (const Case& c : cases) {
    absl::Status s = DecodeBytes(c.bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.reason;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.reason));
    EXPECT_THAT(std::string(s.message()), HasSubstr("frame: "));
  }
  ReceivedFrame frame;
  EXPECT_EQ(DecodeFrame(grpc::ByteBuffer(), &frame).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FrameWireTest, PayloadSizesAreCheckedAgainstTheHeader) {
  std::vector<std::string> frames =
      Encode(Activation(Pattern(1000)), FrameCodec::kZeroCopy);
  ASSERT_EQ(frames.size(), 1u);
  // One byte more payload than the header announces.
  Frame f;
  ASSERT_TRUE(f.ParseFromString(frames[0]));
  f.mutable_payload()->push_back('x');
  absl::StatusOr<Message> m =
      Assemble({f.SerializeAsString()}, FrameCodec::kZeroCopy);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              HasSubstr("payload runs past the announced 4000 bytes"));
  // A frame of another epoch is fenced off before its payload is touched.
  f.set_epoch(kEpoch - 1);
  m = Assemble({f.SerializeAsString()}, FrameCodec::kZeroCopy);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Every prefix of a valid frame, and bounded rounds of random bytes and of
// valid frames with random bytes changed, cut into random slices: decoding
// and assembling either succeeds or fails with a status, and a valid frame
// decodes the same however it is sliced.
TEST(FrameWireTest, TruncatedAndFuzzedFramesNeverCrash) {
  const std::vector<std::string> frames =
      Encode(Activation(Pattern(2000)), FrameCodec::kZeroCopy);
  ASSERT_EQ(frames.size(), 1u);
  const std::string& valid = frames[0];
  for (size_t n = 0; n < valid.size(); n += (n < 64 ? 1 : 97)) {
    const std::string prefix = valid.substr(0, n);
    ReceivedFrame frame;
    if (DecodeFrame(Buffer(prefix), &frame).ok()) {
      FrameAssembler assembler(kJob, kEpoch);
      (void)assembler.Add(frame);  // may fail, must not crash
    }
  }

  std::mt19937 rng(20261129);
  auto random_cuts = [&](size_t size) {
    std::vector<size_t> cuts;
    size_t at = 0;
    while (size > 1 && cuts.size() < 6) {
      at += 1 + rng() % std::max<size_t>(1, size / 3);
      if (at >= size) break;
      cuts.push_back(at);
    }
    return cuts;
  };
  int decoded = 0, rejected = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bytes;
    if (round % 2 == 0) {
      bytes.resize(rng() % 64);
      for (char& c : bytes) c = static_cast<char>(rng());
    } else {
      bytes = valid.substr(0, 80 + rng() % 200);
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < flips; ++i) {
        bytes[rng() % bytes.size()] = static_cast<char>(rng());
      }
    }
    ReceivedFrame frame;
    absl::Status s =
        DecodeFrame(Buffer(bytes, random_cuts(bytes.size())), &frame);
    if (!s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      ++rejected;
      continue;
    }
    ++decoded;
    FrameAssembler assembler(kJob, kEpoch);
    absl::StatusOr<std::optional<Message>> m = assembler.Add(frame);
    (void)m;
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(decoded, 0);

  // However the valid frame is sliced, it decodes to the same message.
  const Tensor expected = Pattern(2000);
  for (int round = 0; round < 200; ++round) {
    ReceivedFrame frame;
    ASSERT_TRUE(
        DecodeFrame(Buffer(valid, random_cuts(valid.size())), &frame).ok());
    FrameAssembler assembler(kJob, kEpoch);
    absl::StatusOr<std::optional<Message>> m = assembler.Add(frame);
    ASSERT_TRUE(m.ok() && m->has_value()) << m.status();
    ASSERT_TRUE(BitwiseEqual((*m)->tensor, expected));
  }
}

}  // namespace
}  // namespace gpipe
