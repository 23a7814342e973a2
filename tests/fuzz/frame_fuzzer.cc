// Fuzzes the Exchange receive path as a stage sees it: bytes from the peer
// arrive as gRPC slices, DecodeFrame parses each frame without copying its
// payload, and a FrameAssembler turns the frames into messages.
//
// The input is a sequence of frames, each a 2-byte little-endian length, a
// 1-byte count of extra slice cuts and the frame bytes; the frame is cut into
// slices at input-chosen points, since a payload or a varint that straddles a
// slice boundary is where a hand-written parser slips. Besides "no crash, no
// sanitizer report", every frame that both decoders accept must decode to the
// same fields and payload (DecodeFrame against protobuf's own parser).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "services/transport/frame_codec.h"
#include "services/transport/frame_wire.h"
#include "services/transport/link.h"

namespace {

// Reads the next frame's bytes and its slice cuts; false at the end.
bool NextFrame(const uint8_t*& data, size_t& size, std::string* bytes,
               std::vector<size_t>* cuts) {
  if (size < 3) return false;
  const size_t len = std::min<size_t>(data[0] | (data[1] << 8), size - 3);
  const size_t ncuts = data[2] % 4;
  data += 3;
  size -= 3;
  bytes->assign(reinterpret_cast<const char*>(data), len);
  data += len;
  size -= len;
  cuts->clear();
  for (size_t i = 0; i < ncuts && size > 0 && len > 0; ++i) {
    cuts->push_back(data[0] % (len + 1));
    ++data;
    --size;
  }
  return true;
}

grpc::ByteBuffer ToBuffer(const std::string& bytes, std::vector<size_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(bytes.size());
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + at, cut - at);
    at = cut;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Serialized(const gpipe::v1::Frame& frame) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    frame.SerializeToCodedStream(&coded);
  }
  return out;
}

// A status-returning API must not hand back OK together with garbage, nor
// an error without a message.
void CheckError(const absl::Status& s) {
  if (!s.ok() && s.message().empty()) std::abort();
}

// One input frame in the format NextFrame reads, cut into two slices.
std::string Wrap(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  std::string out;
  out.push_back(static_cast<char>(bytes.size() & 0xff));
  out.push_back(static_cast<char>(bytes.size() >> 8));
  out.push_back(1);
  out += bytes;
  out.push_back(static_cast<char>(bytes.size() / 2));
  return out;
}

// The seeds of corpus/frame/: an OPEN frame, then messages of every kind
// (a two-chunk activation needs tensors over kMaxChunkBytes, which do not
// fit an input frame; the assembler's chunking is reached by mutation).
void WriteSeeds(const std::string& dir) {
  std::filesystem::create_directories(dir);
  gpipe::v1::Frame open;
  open.set_job_id("job");
  open.set_epoch(2);
  open.set_kind(gpipe::v1::OPEN);
  open.set_from_stage(0);
  const std::string opening = Wrap(gpipe::FrameToBuffer(open));
  std::vector<gpipe::Message> messages(3);
  messages[0].kind = gpipe::MessageKind::kActivation;
  messages[0].step = 4;
  messages[0].micro_batch = 1;
  messages[0].tensor =
      gpipe::Tensor::FromVector(gpipe::Shape({2, 3}), {1, 2, 3, 4, 5, 6});
  messages[1].kind = gpipe::MessageKind::kGradient;
  messages[1].step = 4;
  messages[1].micro_batch = 1;
  messages[1].tensor =
      gpipe::Tensor::FromInts(gpipe::Shape({4}), {1, -2, 3, -4});
  messages[2].kind = gpipe::MessageKind::kGradSquares;
  messages[2].step = 4;
  messages[2].scalar = 2.5;
  int n = 0;
  for (const gpipe::Message& m : messages) {
    for (gpipe::FrameCodec codec :
         {gpipe::FrameCodec::kZeroCopy, gpipe::FrameCodec::kCopying}) {
      std::string input = opening;
      gpipe::WriteFrames(m, "job", 2, codec, [&](const grpc::ByteBuffer& b) {
        input += Wrap(b);
        return true;
      });
      std::ofstream out(std::filesystem::path(dir) / absl::StrCat("seed-", n++),
                        std::ios::binary);
      out << input;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Hostile strings make protobuf log each non-UTF-8 field: noise that
  // slows the run and buries a finding.
  google::protobuf::SetLogHandler(nullptr);
  // GPIPE_FUZZ_WRITE_SEEDS=DIR writes the seed corpus to DIR and exits.
  if (const char* dir = std::getenv("GPIPE_FUZZ_WRITE_SEEDS")) {
    WriteSeeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<gpipe::FrameAssembler> assembler;
  std::string bytes;
  std::vector<size_t> cuts;
  while (NextFrame(data, size, &bytes, &cuts)) {
    const grpc::ByteBuffer buffer = ToBuffer(bytes, cuts);
    gpipe::ReceivedFrame frame, copied;
    const absl::Status zero_copy = gpipe::DecodeFrame(buffer, &frame);
    const absl::Status copying = gpipe::DecodeFrameCopying(buffer, &copied);
    CheckError(zero_copy);
    CheckError(copying);
    if (zero_copy.ok() && copying.ok()) {
      // Both decoders accepted the frame: they must agree on it.
      // Compared serialized (MessageDifferencer holds NaN != NaN, and a
      // peer may send a NaN scalar).
      if (Serialized(frame.fields()) != Serialized(copied.fields()) ||
          frame.payload_size() != copied.payload_size()) {
        std::fprintf(stderr,
                     "frame_fuzzer: the decoders disagree:\nDecodeFrame "
                     "(%lld payload bytes):\n%s\nDecodeFrameCopying (%lld "
                     "payload bytes):\n%s\n",
                     static_cast<long long>(frame.payload_size()),
                     frame.fields().DebugString().c_str(),
                     static_cast<long long>(copied.payload_size()),
                     copied.fields().DebugString().c_str());
        std::abort();
      }
      std::string a(frame.payload_size(), '\0'), b(copied.payload_size(), '\0');
      frame.CopyPayload(a.data());
      copied.CopyPayload(b.data());
      if (a != b) std::abort();
    }
    if (!zero_copy.ok()) continue;
    // The link's job and epoch come from the first frame, as the OPEN frame
    // sets them, so that the fuzzer gets past fencing.
    if (!assembler) {
      assembler.emplace(frame.fields().job_id(), frame.fields().epoch());
    }
    absl::StatusOr<std::optional<gpipe::Message>> m = assembler->Add(frame);
    if (!m.ok()) {
      CheckError(m.status());
      // A link closes on a bad frame; the next stream starts afresh.
      assembler.reset();
      continue;
    }
    const bool carries_tensor =
        m->has_value() && ((*m)->kind == gpipe::MessageKind::kActivation ||
                           (*m)->kind == gpipe::MessageKind::kGradient);
    if (carries_tensor && (*m)->tensor.numel() > 0) {
      // A complete tensor holds the bytes its shape needs (ASan checks the
      // last one is inside the allocation).
      volatile char last = static_cast<const char*>(
          (*m)->tensor.raw())[(*m)->tensor.nbytes() - 1];
      (void)last;
    }
  }
  return 0;
}
