// The shared-memory plane inside a real ExchangeLink pair on loopback gRPC: the
// upstream end offers a segment, the downstream end maps it, tensors of every
// size (one chunk, many chunks, more than the ring holds) come back bitwise;
// forced shared memory that the peer refuses is a clear error; and a peer
// that posts garbage chunks straight into a mapped segment (or sends
// descriptors and releases as frames) is cut off with INVALID_ARGUMENT
// naming what is wrong, without crashing.
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/transport/exchange_link.h"
#include "services/transport/exchange_method.h"
#include "services/transport/shm_futex.h"
#include "services/transport/shm_ring.h"
#include "services/transport/shm_segment.h"
#include "tests/support/echo_stage.h"

namespace gpipe {
namespace {

using gpipe::v1::Frame;
using ::testing::HasSubstr;

constexpr char kJob[] = "job-shm";
constexpr int64_t kEpoch = 2;

using Server = test_support::EchoStageServer;

DataPlaneOptions Planes(DataPlaneMode mode, int64_t ring = kMinShmRingBytes,
                        int64_t chunk = 64 << 10) {
  DataPlaneOptions o;
  o.mode = mode;
  o.ring_bytes = ring;
  o.chunk_bytes = chunk;
  return o;
}

Tensor Pattern(int64_t floats, float seed) {
  Tensor t = Tensor::Empty(Shape({floats}));
  for (int64_t i = 0; i < floats; ++i) t.f32()[i] = seed + 0.25f * (i % 977);
  return t;
}

std::unique_ptr<ExchangeClientLink> Connect(const Server& server,
                                            const DataPlaneOptions& planes) {
  absl::StatusOr<std::unique_ptr<ExchangeClientLink>> link =
      ConnectDownstream(server.address(), kJob, kEpoch, 0, 8, 5000,
                        FrameCodec::kZeroCopy, planes);
  EXPECT_TRUE(link.ok()) << link.status();
  return link.ok() ? std::move(*link) : nullptr;
}

TEST(ShmLinkTest, TensorsOfAnySizeComeBackBitwiseThroughSharedMemory) {
  Server server(Planes(DataPlaneMode::kAuto));
  std::unique_ptr<ExchangeClientLink> link =
      Connect(server, Planes(DataPlaneMode::kShm));
  ASSERT_NE(link, nullptr);
  absl::StatusOr<DataPlaneKind> plane =
      link->link().WaitDataPlane(std::chrono::seconds(5));
  ASSERT_TRUE(plane.ok()) << plane.status();
  EXPECT_EQ(*plane, DataPlaneKind::kShm);
  // One float, one chunk, several chunks, and 2 MiB: twice the ring, so
  // the sender must wait for releases.
  const int64_t sizes[] = {1, 1000, 16 << 10, 100000, 512 << 10};
  for (int round = 0; round < 3; ++round) {
    for (int64_t n : sizes) {
      const Tensor t = Pattern(n, static_cast<float>(round));
      Message m;
      m.kind = MessageKind::kActivation;
      m.step = round;
      m.micro_batch = n;
      m.tensor = t;
      ASSERT_TRUE(link->Send(std::move(m)).ok());
      Message s;
      s.kind = MessageKind::kGradSquares;
      s.step = round;
      s.scalar = 1.5 * n;
      ASSERT_TRUE(link->Send(std::move(s)).ok());
      absl::StatusOr<Message> back = link->Receive();
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->kind, MessageKind::kGradient);
      EXPECT_EQ(back->micro_batch, n);
      EXPECT_TRUE(BitwiseEqual(back->tensor, t)) << n << " floats";
      absl::StatusOr<Message> scalar = link->Receive();
      ASSERT_TRUE(scalar.ok()) << scalar.status();
      EXPECT_EQ(scalar->kind, MessageKind::kGradSquares);
      EXPECT_EQ(scalar->scalar, 1.5 * n);
    }
  }
  EXPECT_EQ(link->bytes_sent(), link->bytes_received());
}

// A stage keeps received activations until its backward pass. Tensors that
// stay in the ring as their storage must not starve the sender: past four
// held chunks (or a quarter of the ring) the receiver copies out, so
// holding every message of a long exchange on a small ring still works.
TEST(ShmLinkTest, HoldingManyReceivedTensorsNeverStallsThePeer) {
  Server server(Planes(DataPlaneMode::kShm));
  std::unique_ptr<ExchangeClientLink> link =
      Connect(server, Planes(DataPlaneMode::kShm, kMinShmRingBytes, 64 << 10));
  ASSERT_NE(link, nullptr);
  ASSERT_EQ(*link->link().WaitDataPlane(std::chrono::seconds(5)),
            DataPlaneKind::kShm);
  std::vector<Tensor> sent, held;
  for (int i = 0; i < 48; ++i) {
    Message m;
    m.micro_batch = i;
    m.tensor = Pattern(15000, static_cast<float>(i));  // 60 KB: one chunk
    sent.push_back(m.tensor);
    ASSERT_TRUE(link->Send(std::move(m)).ok());
    absl::StatusOr<Message> back = link->Receive();
    ASSERT_TRUE(back.ok()) << back.status();
    held.push_back(back->tensor);  // 48 x 60 KB: three times the ring
  }
  for (int i = 0; i < 48; ++i) {
    EXPECT_TRUE(BitwiseEqual(held[i], sent[i])) << i;
  }
}

TEST(ShmLinkTest, AutoFallsBackToFramesWhenThePeerRunsGrpc) {
  Server server(Planes(DataPlaneMode::kGrpc));
  std::unique_ptr<ExchangeClientLink> link =
      Connect(server, Planes(DataPlaneMode::kAuto));
  ASSERT_NE(link, nullptr);
  absl::StatusOr<DataPlaneKind> plane =
      link->link().WaitDataPlane(std::chrono::seconds(5));
  ASSERT_TRUE(plane.ok()) << plane.status();
  EXPECT_EQ(*plane, DataPlaneKind::kGrpc);
  EXPECT_THAT(link->link().data_plane_refusal(),
              HasSubstr("--data_plane grpc"));
  const Tensor t = Pattern(300000, 2);
  Message m;
  m.tensor = t;
  ASSERT_TRUE(link->Send(std::move(m)).ok());
  absl::StatusOr<Message> back = link->Receive();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(BitwiseEqual(back->tensor, t));
}

TEST(ShmLinkTest, ForcedSharedMemoryThatThePeerRefusesIsAClearError) {
  Server server(Planes(DataPlaneMode::kGrpc));
  std::unique_ptr<ExchangeClientLink> link =
      Connect(server, Planes(DataPlaneMode::kShm));
  ASSERT_NE(link, nullptr);
  absl::StatusOr<DataPlaneKind> plane =
      link->link().WaitDataPlane(std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsFailedPrecondition(plane.status())) << plane.status();
  EXPECT_THAT(plane.status().message(),
              HasSubstr("--data_plane shm: the next stage cannot share"));
  Message m;
  m.tensor = Pattern(10, 0);
  absl::Status sent = link->Send(std::move(m));
  EXPECT_TRUE(absl::IsFailedPrecondition(sent)) << sent;
  link->Close();
}

// A hand-driven upstream end: OPEN and a real offer, then whatever frames
// the test writes; returns the status the downstream end finished with.
class RawPeer : public test_support::RawUpstream {
 public:
  explicit RawPeer(const Server& server)
      : RawUpstream(server.address(), kJob, kEpoch) {}

  // OPEN, and an offer of a fresh segment that the peer maps.
  void OpenWithSegment() {
    Frame open = Base(gpipe::v1::OPEN);
    ASSERT_TRUE(Write(open));
    absl::StatusOr<std::unique_ptr<ShmSegment>> seg =
        ShmSegment::Create(kMinShmRingBytes, 77);
    ASSERT_TRUE(seg.ok()) << seg.status();
    segment_ = std::move(*seg);
    Frame offer = Base(gpipe::v1::DATA_PLANE_OFFER);
    const HostIdentity h = ThisHost();
    gpipe::v1::ShmOffer* o = offer.mutable_shm_offer();
    o->set_pid(getpid());
    o->set_fd(segment_->fd());
    o->set_ring_bytes(kMinShmRingBytes);
    o->set_segment_bytes(ShmSegmentBytes(kMinShmRingBytes));
    o->set_nonce(77);
    o->set_boot_id(h.boot_id);
    o->set_ipc_namespace(h.ipc_namespace);
    ASSERT_TRUE(Write(offer));
    ReceivedFrame answer;
    ASSERT_TRUE(Read(&answer));
    ASSERT_EQ(answer.fields().kind(), gpipe::v1::DATA_PLANE_ANSWER);
    ASSERT_EQ(answer.fields().data_plane(), "shm") << answer.fields().refusal();
    ASSERT_EQ(segment_->answer_nonce(), answer.fields().answer_nonce());
  }

  // The fields of an activation of `floats` floats.
  Frame Activation(int64_t floats, bool last = true) {
    Frame f = Base(gpipe::v1::ACTIVATION);
    f.mutable_header()->set_dtype(gpipe::v1::FLOAT32);
    f.mutable_header()->mutable_shape()->add_dims(floats);
    f.set_total_bytes(floats * 4);
    f.set_last(last);
    return f;
  }

  // Writes `fields` and `payload` bytes at `offset` of the downstream ring
  // as the writer would, then posts the chunk (sequence, offset, length
  // and header size as given, unchecked).
  void Put(int64_t offset, const std::string& fields, int64_t payload) {
    char* ring = segment_->ring(ShmSegment::kDownstream);
    std::memcpy(ring + offset, fields.data(), fields.size());
    std::memset(ring + offset + ShmAlignUp(fields.size()), 0x3f,
                static_cast<size_t>(payload));
  }
  void Post(int64_t sequence, int64_t offset, int64_t length,
            int64_t header_bytes) {
    ShmQueues* q = segment_->queues(ShmSegment::kDownstream);
    ShmPostedChunk& d = q->descriptors[posted_ % kShmQueueSlots];
    d.sequence.store(sequence);
    d.offset.store(offset);
    d.length.store(length);
    d.header_bytes.store(header_bytes);
    q->posted.store(++posted_);
    FutexWakeAll(&q->posted);
  }
  // A well-formed chunk of `fields` and `payload` bytes at `offset`.
  void PutAndPost(int64_t sequence, int64_t offset, const Frame& fields,
                  int64_t payload) {
    const std::string head = fields.SerializeAsString();
    Put(offset, head, payload);
    Post(sequence, offset,
         payload > 0 ? ShmAlignUp(head.size()) + payload
                     : static_cast<int64_t>(head.size()),
         static_cast<int64_t>(head.size()));
  }
  ShmSegment& segment() { return *segment_; }
  void SetPosted(uint32_t n) {
    ShmQueues* q = segment_->queues(ShmSegment::kDownstream);
    q->posted.store(n);
    FutexWakeAll(&q->posted);
  }

 private:
  std::unique_ptr<ShmSegment> segment_;
  uint32_t posted_ = 0;
};

TEST(ShmLinkTest, GarbageChunksInTheSegmentAreRejectedWithoutACrash) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  struct Case {
    const char* what;
    std::function<void(RawPeer&)> send;
    const char* message;
  };
  const Case cases[] = {
      {"offset past the ring",
       [](RawPeer& p) { p.Post(0, kMinShmRingBytes - 64, 128, 16); },
       "outside the ring"},
      {"overflowing offset", [](RawPeer& p) { p.Post(0, kMax - 10, 128, 16); },
       "outside the ring"},
      {"negative length", [](RawPeer& p) { p.Post(0, 0, -64, 16); },
       "chunk length -64"},
      {"misaligned", [](RawPeer& p) { p.Post(0, 8, 64, 16); }, "not aligned"},
      {"a header longer than the chunk",
       [](RawPeer& p) { p.Post(0, 0, 64, 65); }, "65 header bytes"},
      {"not the next sequence", [](RawPeer& p) { p.Post(5, 0, 64, 16); },
       "where chunk 0 comes next"},
      {"replayed",
       [](RawPeer& p) {
         p.PutAndPost(0, 0, p.Activation(16), 64);
         p.Post(0, 0, 192, 30);
       },
       "descriptor of chunk 0 where chunk 1 comes next"},
      {"more chunks posted than can be in use",
       [](RawPeer& p) { p.SetPosted(1000); }, "1000 chunks at once"},
      {"fields that do not parse",
       [](RawPeer& p) {
         p.Put(0, std::string(16, '\xff'), 0);
         p.Post(0, 0, 16, 16);
       },
       "do not parse as gpipe.v1.Frame"},
      {"a payload field inside the fields",
       [](RawPeer& p) {
         Frame f = p.Activation(16);
         f.set_payload(std::string(64, 'x'));
         p.PutAndPost(0, 0, f, 0);
       },
       "carries a payload field"},
      {"fewer bytes than the header announces",
       [](RawPeer& p) { p.PutAndPost(0, 0, p.Activation(16), 32); },
       "tensor ended after 32 of 64 bytes"},
      {"more bytes than the header announces",
       [](RawPeer& p) { p.PutAndPost(0, 0, p.Activation(4), 64); },
       "runs past the announced 16 bytes"},
      {"a descriptor in a frame",
       [](RawPeer& p) {
         Frame f = p.Activation(16);
         f.mutable_shm_slot()->set_length(64);
         p.Write(f);
       },
       "travel in the segment"},
      {"a release in a frame",
       [](RawPeer& p) {
         Frame f = p.Base(gpipe::v1::SHM_RELEASE);
         f.mutable_shm_slot()->set_sequence(3);
         p.Write(f);
       },
       "travel in the segment"},
      {"a message in a frame once shared memory carries them",
       [](RawPeer& p) {
         Frame f = p.Activation(1);
         f.set_payload(std::string(4, 'x'));
         p.Write(f);
       },
       "a message in a frame on a link whose messages travel in shared"},
  };
  Server server(Planes(DataPlaneMode::kAuto));
  for (const Case& c : cases) {
    RawPeer peer(server);
    ASSERT_NO_FATAL_FAILURE(peer.OpenWithSegment()) << c.what;
    c.send(peer);
    const grpc::Status s = peer.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.what << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.what;
  }
  // A descriptor frame without any segment, and a chunk of another epoch
  // (fencing comes before the tensor is assembled).
  {
    RawPeer peer(server);
    ASSERT_TRUE(peer.Write(peer.Base(gpipe::v1::OPEN)));
    Frame f = peer.Activation(16);
    f.mutable_shm_slot()->set_length(64);
    peer.Write(f);
    const grpc::Status s = peer.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("travel in the segment"));
  }
  {
    RawPeer peer(server);
    ASSERT_NO_FATAL_FAILURE(peer.OpenWithSegment());
    Frame f = peer.Activation(16);
    f.set_epoch(kEpoch - 1);
    peer.PutAndPost(0, 0, f, 64);
    const grpc::Status s = peer.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("epoch 1"));
  }
  // A well-formed chunk written by hand arrives, its tensor stored in the
  // ring itself, and goes back to the writer when that tensor is freed.
  {
    RawPeer peer(server);
    ASSERT_NO_FATAL_FAILURE(peer.OpenWithSegment());
    peer.PutAndPost(0, 0, peer.Activation(16), 64);
    // The echo answers in the upstream ring, as a gradient.
    ShmQueues* up = peer.segment().queues(ShmSegment::kUpstream);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (up->posted.load() == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(up->posted.load(), 1u);
    const ShmPostedChunk& d = up->descriptors[0];
    const char* bytes =
        peer.segment().ring(ShmSegment::kUpstream) + d.offset.load();
    Frame back;
    ASSERT_TRUE(
        back.ParseFromArray(bytes, static_cast<int>(d.header_bytes.load())));
    EXPECT_EQ(back.kind(), gpipe::v1::GRADIENT);
    EXPECT_EQ(d.length.load() - ShmAlignUp(d.header_bytes.load()), 64);
    // The echo sent the tensor on and freed it: chunk 0 was given back.
    ShmQueues* down = peer.segment().queues(ShmSegment::kDownstream);
    while (down->released.load() == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(down->released.load(), 1u);
    EXPECT_EQ(down->releases[0].load(), 0);
    // (The echo may close before its thread lets go: OK or CANCELLED.)
    const grpc::Status s = peer.Finish();
    EXPECT_NE(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << s.error_message();
  }
  // The server still serves a well-behaved peer.
  std::unique_ptr<ExchangeClientLink> link =
      Connect(server, Planes(DataPlaneMode::kShm));
  ASSERT_NE(link, nullptr);
  Message m;
  m.tensor = Pattern(5000, 1);
  const Tensor sent = m.tensor;
  ASSERT_TRUE(link->Send(std::move(m)).ok());
  absl::StatusOr<Message> back = link->Receive();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(BitwiseEqual(back->tensor, sent));
}

// A downstream end that maps the upstream's segment and answers, then
// offers a segment back: taking it would replace the plane in use (start a
// second shared-memory reader), so the upstream must refuse it.
class OfferBackService final : public ExchangeService {
 public:
  grpc::Status Exchange(grpc::ServerContext* context,
                        ExchangeServerStream* stream) override {
    absl::StatusOr<Frame> open = ReadOpenFrame(stream);
    if (!open.ok()) return ToGrpcStatus(open.status());
    grpc::ByteBuffer b;
    ReceivedFrame offer;
    if (!stream->Read(&b) || !DecodeFrame(b, &offer).ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "no offer");
    }
    const gpipe::v1::ShmOffer& o = offer.fields().shm_offer();
    absl::StatusOr<std::unique_ptr<ShmSegment>> mapped = ShmSegment::OpenPeer(
        o.pid(), o.fd(), o.ring_bytes(), o.nonce(), /*answer_nonce=*/99);
    if (!mapped.ok()) return ToGrpcStatus(mapped.status());
    Frame answer;
    answer.set_job_id(kJob);
    answer.set_epoch(kEpoch);
    answer.set_kind(gpipe::v1::DATA_PLANE_ANSWER);
    answer.set_data_plane("shm");
    answer.set_answer_nonce(99);
    stream->Write(FrameToBuffer(answer));
    Frame again = offer.fields();  // the same kind of offer, back upstream
    stream->Write(FrameToBuffer(again));
    while (stream->Read(&b)) {
    }
    return grpc::Status::OK;
  }
};

TEST(ShmLinkTest, AnOfferComingBackUpstreamIsRejectedNotTaken) {
  OfferBackService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  absl::StatusOr<std::unique_ptr<ExchangeClientLink>> link = ConnectDownstream(
      "127.0.0.1:" + std::to_string(port), kJob, kEpoch, 0, 8, 5000,
      FrameCodec::kZeroCopy, Planes(DataPlaneMode::kShm));
  ASSERT_TRUE(link.ok()) << link.status();
  absl::StatusOr<Message> m = (*link)->Receive();
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument)
      << m.status();
  EXPECT_THAT(m.status().message(), HasSubstr("second data-plane offer"));
  (*link)->Close();
  link->reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace
}  // namespace gpipe
