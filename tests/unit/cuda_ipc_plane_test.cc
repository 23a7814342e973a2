// The CUDA IPC data plane's decisions, on the CPU: --data_plane parsing, an
// offer from another host, a process without a GPU, another GPU, malformed
// sizes and handles; every garbage descriptor rejected against a fake ring
// size before a byte would be copied; and on real ExchangeLinks over loopback
// gRPC the fall-backs in `auto` and the clear errors of a forced cuda_ipc.
// Nothing here needs a GPU (cuda_ipc_link_test moves real device tensors).
#include "services/transport/cuda_ipc_plane.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/tensor/device.h"
#include "services/transport/exchange_link.h"
#include "services/transport/exchange_method.h"
#include "tests/support/cuda_test_util.h"
#include "tests/support/echo_stage.h"

namespace gpipe {
namespace {

using gpipe::v1::CudaIpcOffer;
using gpipe::v1::Frame;
using ::testing::HasSubstr;

constexpr char kJob[] = "job-ipc";
constexpr int64_t kEpoch = 3;
constexpr int64_t kRing = kMinShmRingBytes;  // the fake buffer's ring
const std::string kUuid = "0123456789abcdef";

TEST(CudaIpcPlaneTest, ModeParsesAndPlaneIsNamed) {
  absl::StatusOr<DataPlaneMode> mode = ParseDataPlaneMode("cuda_ipc");
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ(*mode, DataPlaneMode::kCudaIpc);
  EXPECT_STREQ(DataPlaneModeName(DataPlaneMode::kCudaIpc), "cuda_ipc");
  EXPECT_STREQ(DataPlaneName(DataPlaneKind::kCudaIpc), "cuda_ipc");
  absl::StatusOr<DataPlaneMode> bad = ParseDataPlaneMode("cuda");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("cuda_ipc"));
  DataPlaneOptions o;
  o.cuda_ipc_ring_bytes = 1000;
  EXPECT_THAT(ValidateDataPlaneOptions(o).message(),
              HasSubstr("--cuda_ipc_ring_bytes 1000 is outside"));
}

CudaIpcOffer GoodOffer() {
  CudaIpcOffer o;
  const HostIdentity h = ThisHost();
  o.set_boot_id(h.boot_id);
  o.set_ipc_namespace(h.ipc_namespace);
  o.set_device_uuid(kUuid);
  o.set_memory_handle(std::string(kCudaIpcHandleBytes, 'm'));
  for (int i = 0; i < 2 * kCudaIpcEvents; ++i)
    o.add_event_handles(std::string(kCudaIpcHandleBytes, 'e'));
  o.set_ring_bytes(kRing);
  o.set_buffer_bytes(CudaIpcBufferBytes(kRing));
  o.set_nonce(42);
  return o;
}

TEST(CudaIpcPlaneTest, OfferIsTakenOnlyOnThisHostAndThisGpu) {
  const HostIdentity here = ThisHost();
  EXPECT_EQ(CudaIpcOfferMismatch(GoodOffer(), here, kUuid), "");
  struct Case {
    const char* what;
    std::function<void(CudaIpcOffer&)> spoil;
    std::string local_uuid;
    const char* reason;
  };
  const Case cases[] = {
      {"another host", [](CudaIpcOffer& o) { o.set_boot_id("elsewhere"); },
       kUuid, "another host"},
      {"no boot id", [](CudaIpcOffer& o) { o.clear_boot_id(); }, kUuid,
       "another host"},
      {"no GPU here", [](CudaIpcOffer&) {}, "", "no GPU in this process"},
      {"another GPU", [](CudaIpcOffer&) {}, "fedcba9876543210",
       "another GPU (30313233"},
      {"ring too small", [](CudaIpcOffer& o) { o.set_ring_bytes(4096); }, kUuid,
       "device ring of 4096 bytes is out of bounds"},
      {"buffer size", [](CudaIpcOffer& o) { o.set_buffer_bytes(12); }, kUuid,
       "device buffer of 12 bytes"},
      {"short memory handle",
       [](CudaIpcOffer& o) { o.set_memory_handle("abc"); }, kUuid,
       "memory handle of 3 bytes"},
      {"missing events",
       [](CudaIpcOffer& o) { o.mutable_event_handles()->RemoveLast(); }, kUuid,
       "31 event handles"},
      {"short event handle",
       [](CudaIpcOffer& o) { o.set_event_handles(5, "x"); }, kUuid,
       "an event handle of 1 bytes"},
      {"no nonce", [](CudaIpcOffer& o) { o.set_nonce(0); }, kUuid, "no nonce"},
  };
  for (const Case& c : cases) {
    CudaIpcOffer o = GoodOffer();
    c.spoil(o);
    EXPECT_THAT(CudaIpcOfferMismatch(o, here, c.local_uuid),
                HasSubstr(c.reason))
        << c.what;
  }
}

Frame Descriptor(int64_t floats, int64_t offset, int64_t length,
                 int64_t sequence, bool last = true, bool header = true) {
  Frame f;
  f.set_job_id(kJob);
  f.set_epoch(kEpoch);
  f.set_kind(gpipe::v1::ACTIVATION);
  f.set_step(7);
  f.set_micro_batch(1);
  if (header) {
    f.mutable_header()->set_dtype(gpipe::v1::FLOAT32);
    f.mutable_header()->mutable_shape()->add_dims(floats);
    f.set_total_bytes(floats * 4);
  }
  f.set_last(last);
  f.mutable_cuda_ipc_slot()->set_offset(offset);
  f.mutable_cuda_ipc_slot()->set_length(length);
  f.mutable_cuda_ipc_slot()->set_sequence(sequence);
  return f;
}

CudaIpcAssembler Assembler() {
  return CudaIpcAssembler(kJob, kEpoch, kRing, kRing / 2);
}

TEST(CudaIpcPlaneTest, DescriptorsAreCheckedChunkByChunkInRingOrder) {
  CudaIpcAssembler a = Assembler();
  absl::StatusOr<CudaIpcChunk> one = a.Add(Descriptor(16, 0, 64, 0));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_TRUE(one->first);
  EXPECT_TRUE(one->last);
  EXPECT_EQ(one->message.kind, MessageKind::kActivation);
  EXPECT_EQ(one->message.step, 7);
  EXPECT_EQ(one->message.micro_batch, 1);
  EXPECT_EQ(one->shape, Shape({16}));
  EXPECT_EQ(one->slot.length(), 64);
  // A tensor of two half-rings: two chunks; the second does not fit before
  // the ring's end and wraps to its start, as the writer places it.
  const int64_t half = kRing / 2, floats = 2 * half / 4;
  absl::StatusOr<CudaIpcChunk> first =
      a.Add(Descriptor(floats, 64, half, 1, /*last=*/false));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->first);
  EXPECT_FALSE(first->last);
  absl::StatusOr<CudaIpcChunk> second =
      a.Add(Descriptor(floats, 0, half, 2, true, false));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->first);
  EXPECT_TRUE(second->last);
  EXPECT_EQ(second->slot.offset(), 0);
  EXPECT_EQ(second->slot.sequence(), 2);
}

TEST(CudaIpcPlaneTest, GarbageDescriptorsAreRejectedAndChangeNothing) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  struct Case {
    const char* what;
    Frame frame;
    const char* message;
  };
  Frame other_epoch = Descriptor(16, 0, 64, 0);
  other_epoch.set_epoch(kEpoch - 1);
  Frame payload = Descriptor(16, 0, 64, 0);
  payload.set_payload("xx");
  Frame scalar = Descriptor(16, 0, 64, 0);
  scalar.set_kind(gpipe::v1::GRAD_SQUARES);
  Frame dtype = Descriptor(16, 0, 64, 0);
  dtype.mutable_header()->set_dtype(gpipe::v1::DType(99));
  Frame huge = Descriptor(16, 0, 64, 0);
  huge.mutable_header()->mutable_shape()->add_dims(kMax / 2);
  const Case cases[] = {
      {"offset past the ring", Descriptor(16, kRing - 8, 64, 0),
       "outside the ring"},
      {"overflowing offset", Descriptor(16, kMax - 10, 64, 0),
       "outside the ring"},
      {"negative length", Descriptor(16, 0, -64, 0),
       "chunk length -64 is not positive"},
      {"chunk longer than half the ring",
       Descriptor(kRing / 4 + 1, 0, kRing / 2 + 4, 0, false), "chunk length"},
      {"not the next sequence", Descriptor(16, 0, 64, 5),
       "where chunk 0 comes next"},
      {"wrong offset", Descriptor(16, 128, 64, 0),
       "where the writer places it at 0"},
      {"fewer bytes than the header", Descriptor(16, 0, 32, 0),
       "tensor ended after 32 of 64 bytes"},
      {"more bytes than the header", Descriptor(4, 0, 64, 0),
       "runs past the announced 16 bytes"},
      {"header without bytes", Descriptor(0, 0, 64, 0), "announces 0 bytes"},
      {"a payload as well", payload, "both a payload and a device slot"},
      {"a scalar with a slot", scalar, "only activations and gradients"},
      {"bad dtype", dtype, "dtype 99"},
      {"huge shape", huge, "bad dimension"},
      {"another epoch", other_epoch, "rejected"},
  };
  for (const Case& c : cases) {
    CudaIpcAssembler a = Assembler();
    auto r = a.Add(c.frame);
    EXPECT_FALSE(r.ok()) << c.what;
    EXPECT_THAT(r.status().message(), HasSubstr(c.message)) << c.what;
    // Nothing moved: the honest first chunk is still the one expected.
    auto honest = a.Add(Descriptor(16, 0, 64, 0));
    EXPECT_TRUE(honest.ok() && honest->first && honest->last)
        << c.what << ": " << honest.status();
  }
  CudaIpcAssembler a = Assembler();
  ASSERT_TRUE(a.Add(Descriptor(16, 0, 64, 0)).ok());
  auto replayed = a.Add(Descriptor(16, 0, 64, 0));
  EXPECT_THAT(replayed.status().message(),
              HasSubstr("descriptor of chunk 0 where chunk 1 comes next"));
  // A chunk of another micro-batch inside a tensor.
  ASSERT_TRUE(a.Add(Descriptor(64, 64, 128, 1, false)).ok());
  Frame intruder = Descriptor(64, 192, 128, 2, true, false);
  intruder.set_micro_batch(2);
  EXPECT_THAT(a.Add(intruder).status().message(),
              HasSubstr("inside the tensor of micro-batch 1"));
}

// --- On real links: a downstream stage that echoes
// (tests/support/echo_stage.h).

using Server = test_support::EchoStageServer;

DataPlaneOptions Planes(DataPlaneMode mode, bool on_gpu) {
  DataPlaneOptions o;
  o.mode = mode;
  o.on_gpu = on_gpu;
  o.ring_bytes = kMinShmRingBytes;
  o.chunk_bytes = 64 << 10;
  o.cuda_ipc_ring_bytes = kMinShmRingBytes;
  return o;
}

absl::StatusOr<std::unique_ptr<ExchangeClientLink>> Connect(
    const Server& server, const DataPlaneOptions& planes) {
  return ConnectDownstream(server.address(), kJob, kEpoch, 0, 8, 5000,
                           FrameCodec::kOneCopy, planes);
}

TEST(CudaIpcPlaneTest, ForcedCudaIpcOnACpuStageIsAClearError) {
  Server server(Planes(DataPlaneMode::kAuto, true));
  auto link = Connect(server, Planes(DataPlaneMode::kCudaIpc, false));
  EXPECT_TRUE(absl::IsFailedPrecondition(link.status())) << link.status();
  EXPECT_THAT(link.status().message(),
              HasSubstr("--data_plane cuda_ipc: this stage does not compute "
                        "on a GPU"));
}

TEST(CudaIpcPlaneTest, ForcedCudaIpcWithoutAGpuIsAClearError) {
  if (cuda_test::RealGpu())
    return;  // there the buffer is made (cuda_ipc_link_test)
  Server server(Planes(DataPlaneMode::kAuto, true));
  auto link = Connect(server, Planes(DataPlaneMode::kCudaIpc, true));
  EXPECT_TRUE(absl::IsFailedPrecondition(link.status())) << link.status();
  EXPECT_THAT(link.status().message(), HasSubstr("--data_plane cuda_ipc: "));
}

TEST(CudaIpcPlaneTest, AutoFallsBackToSharedMemoryAndSaysWhy) {
  if (cuda_test::RealGpu()) return;  // there CUDA IPC is taken
  Server server(Planes(DataPlaneMode::kAuto, true));
  auto link = Connect(server, Planes(DataPlaneMode::kAuto, true));
  ASSERT_TRUE(link.ok()) << link.status();
  absl::StatusOr<DataPlaneKind> plane =
      (*link)->link().WaitDataPlane(std::chrono::seconds(5));
  ASSERT_TRUE(plane.ok()) << plane.status();
  EXPECT_EQ(*plane, DataPlaneKind::kShm);
  EXPECT_THAT((*link)->link().data_plane_refusal(), HasSubstr("no CUDA IPC"));
  EXPECT_FALSE((*link)->CarriesDeviceTensors());
  Message m;
  m.tensor = Tensor::Empty(Shape({1000}));
  for (int i = 0; i < 1000; ++i) m.tensor.f32()[i] = 0.5f * i;
  const Tensor sent = m.tensor.Clone();
  ASSERT_TRUE((*link)->Send(std::move(m)).ok());
  absl::StatusOr<Message> back = (*link)->Receive();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(BitwiseEqual(back->tensor, sent));
}

TEST(CudaIpcPlaneTest, CpuStagesNeitherOfferNorMentionCudaIpc) {
  Server server(Planes(DataPlaneMode::kAuto, false));
  auto link = Connect(server, Planes(DataPlaneMode::kAuto, false));
  ASSERT_TRUE(link.ok()) << link.status();
  absl::StatusOr<DataPlaneKind> plane =
      (*link)->link().WaitDataPlane(std::chrono::seconds(5));
  ASSERT_TRUE(plane.ok()) << plane.status();
  EXPECT_EQ(*plane, DataPlaneKind::kShm);
  EXPECT_EQ((*link)->link().data_plane_refusal(), "");
}

// A hand-driven upstream end that offers a (fake) device buffer.
class RawPeer : public test_support::RawUpstream {
 public:
  explicit RawPeer(const Server& server)
      : RawUpstream(server.address(), kJob, kEpoch) {}
  // OPEN and `offer`; the answer.
  Frame Offer(const CudaIpcOffer& offer) {
    Write(Base(gpipe::v1::OPEN));
    Frame f = Base(gpipe::v1::DATA_PLANE_OFFER);
    *f.mutable_cuda_ipc_offer() = offer;
    Write(f);
    ReceivedFrame answer;
    return Read(&answer) ? answer.fields() : Frame();
  }
};

TEST(CudaIpcPlaneTest, DownstreamRefusesAnOfferItCannotTakeAndSaysWhy) {
  Server server(Planes(DataPlaneMode::kAuto, true));
  {
    RawPeer peer(server);
    CudaIpcOffer o = GoodOffer();
    o.set_boot_id("another-boot");
    const Frame answer = peer.Offer(o);
    EXPECT_EQ(answer.kind(), gpipe::v1::DATA_PLANE_ANSWER);
    EXPECT_EQ(answer.data_plane(), "grpc");
    EXPECT_THAT(answer.refusal(), HasSubstr("no CUDA IPC: another host"));
    // A refusal in `auto` is no error (the echo's Close may cancel).
    const grpc::Status s = peer.Finish();
    EXPECT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::CANCELLED)
        << s.error_message();
  }
  {
    RawPeer peer(server);
    const Frame answer = peer.Offer(GoodOffer());
    EXPECT_EQ(answer.data_plane(), "grpc");
    // No GPU: nothing to compare with; a GPU: not the offer's made-up one.
    EXPECT_THAT(answer.refusal(),
                HasSubstr(cuda_test::RealGpu() ? "another GPU"
                                               : "no GPU in this process"));
    // A refusal in `auto` is no error (the echo's Close may cancel).
    const grpc::Status s = peer.Finish();
    EXPECT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::CANCELLED)
        << s.error_message();
  }
}

TEST(CudaIpcPlaneTest, ForcedCudaIpcDownstreamEndsTheStreamWithTheReason) {
  Server server(Planes(DataPlaneMode::kCudaIpc, true));
  {
    RawPeer peer(server);
    CudaIpcOffer o = GoodOffer();
    o.set_boot_id("another-boot");
    const Frame answer = peer.Offer(o);
    EXPECT_EQ(answer.data_plane(), "grpc");
    const grpc::Status s = peer.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(),
                HasSubstr("--data_plane cuda_ipc: cannot open the upstream "
                          "stage's device buffer: another host"));
  }
  {
    // Frames without any offer.
    RawPeer peer(server);
    peer.Write(peer.Base(gpipe::v1::OPEN));
    Frame scalar = peer.Base(gpipe::v1::GRAD_SQUARES);
    scalar.set_last(true);
    peer.Write(scalar);
    const grpc::Status s = peer.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("without offering a device"));
  }
}

TEST(CudaIpcPlaneTest, DescriptorsAndReleasesWithoutThePlaneAreRejected) {
  Server server(Planes(DataPlaneMode::kAuto, false));
  {
    RawPeer peer(server);
    peer.Write(peer.Base(gpipe::v1::OPEN));
    peer.Write(Descriptor(16, 0, 64, 0));
    const grpc::Status s = peer.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(),
                HasSubstr("a CUDA IPC descriptor on a link without CUDA IPC"));
  }
  {
    RawPeer peer(server);
    peer.Write(peer.Base(gpipe::v1::OPEN));
    Frame release = peer.Base(gpipe::v1::CUDA_IPC_RELEASE);
    release.mutable_cuda_ipc_slot()->set_sequence(0);
    peer.Write(release);
    const grpc::Status s = peer.Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("a CUDA IPC release on a link"));
  }
}

}  // namespace
}  // namespace gpipe
