// Each data plane and the negotiation on their own, without a gRPC server:
// two ends joined by an in-memory frame stream. The frames plane
// reassembles what it sends and refuses CUDA IPC frames; the shared-memory
// plane moves messages through a real segment and refuses messages in
// frames; the negotiator agrees on the best plane both ends allow, and
// every refusal is typed (why not CUDA IPC, why not shared memory).
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/transport/control_stream.h"
#include "services/transport/frame_data_plane.h"
#include "services/transport/plane_negotiator.h"
#include "services/transport/shm_data_plane.h"
#include "services/transport/shm_segment.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = "job-planes";
constexpr int64_t kEpoch = 3;

// One direction of an in-memory stream.
class Pipe {
 public:
  bool Write(const grpc::ByteBuffer& b) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    frames_.push_back(b);
    cv_.notify_all();
    return true;
  }
  bool Read(grpc::ByteBuffer* b) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_ || !frames_.empty(); });
    if (frames_.empty()) return false;
    *b = frames_.front();
    frames_.pop_front();
    return true;
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<grpc::ByteBuffer> frames_;
  bool closed_ = false;
};

class PipeStream final : public FrameStream {
 public:
  PipeStream(std::shared_ptr<Pipe> in, std::shared_ptr<Pipe> out)
      : in_(std::move(in)), out_(std::move(out)) {}
  bool Read(grpc::ByteBuffer* b) override { return in_->Read(b); }
  bool Write(const grpc::ByteBuffer& b) override { return out_->Write(b); }
  void Cancel() override {
    in_->Close();
    out_->Close();
  }

 private:
  std::shared_ptr<Pipe> in_, out_;
};

// One end: its control stream, inbox and planes, as a link holds them.
// kOneCopy: a zero-copy send waits for the stream to let go of its slices,
// which this in-memory stream does only once the frames are read.
struct End {
  explicit End(std::unique_ptr<FrameStream> stream)
      : control(std::move(stream)),
        context{kJob,
                kEpoch,
                &control,
                &inbox,
                FrameCodec::kOneCopy,
                [this](const absl::Status& why) {
                  std::lock_guard<std::mutex> lock(mu);
                  failure = why;
                  inbox.Close(why);
                }},
        inbox(16),
        frames(context),
        negotiator(context, &frames) {}

  // Reads the next frame of the stream as a ReceivedFrame.
  std::optional<ReceivedFrame> NextFrame() {
    grpc::ByteBuffer b;
    if (!control.Read(&b)) return std::nullopt;
    ReceivedFrame f;
    if (!DecodeFrame(b, &f).ok()) return std::nullopt;
    return f;
  }
  absl::Status failed() {
    std::lock_guard<std::mutex> lock(mu);
    return failure;
  }

  ControlStream control;
  const PlaneContext context;
  MessageQueue inbox;
  FrameDataPlane frames;
  PlaneNegotiator negotiator;
  std::mutex mu;
  absl::Status failure;
};

std::pair<std::unique_ptr<End>, std::unique_ptr<End>> Ends() {
  auto a = std::make_shared<Pipe>(), b = std::make_shared<Pipe>();
  return {std::make_unique<End>(std::make_unique<PipeStream>(a, b)),
          std::make_unique<End>(std::make_unique<PipeStream>(b, a))};
}

Tensor Pattern(int64_t floats, float seed) {
  Tensor t = Tensor::Empty(Shape({floats}));
  for (int64_t i = 0; i < floats; ++i) t.f32()[i] = seed + 0.5f * (i % 613);
  return t;
}

Message Activation(int64_t micro_batch, const Tensor& t) {
  Message m;
  m.kind = MessageKind::kActivation;
  m.step = 7;
  m.micro_batch = micro_batch;
  m.tensor = t;
  return m;
}

DataPlaneOptions Planes(DataPlaneMode mode) {
  DataPlaneOptions o;
  o.mode = mode;
  o.ring_bytes = kMinShmRingBytes;
  o.chunk_bytes = 64 << 10;
  return o;
}

TEST(FrameDataPlaneTest, SendsFramesTheOtherEndReassembles) {
  auto [up, down] = Ends();
  EXPECT_EQ(up->frames.kind(), DataPlaneKind::kGrpc);
  EXPECT_FALSE(up->frames.CarriesDeviceTensors());
  // Larger than one frame's chunk: several frames, one message.
  const Tensor t = Pattern(600000, 1);
  ASSERT_TRUE(up->frames.Send(Activation(2, t)).ok());
  std::optional<Message> got;
  int frames = 0;
  while (!got.has_value()) {
    std::optional<ReceivedFrame> f = down->NextFrame();
    ASSERT_TRUE(f.has_value());
    ++frames;
    absl::StatusOr<std::optional<Message>> m = down->frames.OnFrame(*f);
    ASSERT_TRUE(m.ok()) << m.status();
    got = *std::move(m);
  }
  EXPECT_GT(frames, 1);
  EXPECT_EQ(got->micro_batch, 2);
  EXPECT_TRUE(BitwiseEqual(got->tensor, t));
}

TEST(FrameDataPlaneTest, RefusesCudaIpcFrames) {
  auto [up, down] = Ends();
  ReceivedFrame release, descriptor;
  gpipe::v1::Frame f;
  f.set_job_id(kJob);
  f.set_epoch(kEpoch);
  f.set_kind(gpipe::v1::CUDA_IPC_RELEASE);
  ASSERT_TRUE(DecodeFrame(FrameToBuffer(f), &release).ok());
  absl::StatusOr<std::optional<Message>> m = down->frames.OnFrame(release);
  EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  EXPECT_THAT(m.status().message(), HasSubstr("without CUDA IPC"));
  f.set_kind(gpipe::v1::ACTIVATION);
  f.mutable_cuda_ipc_slot()->set_length(16);
  ASSERT_TRUE(DecodeFrame(FrameToBuffer(f), &descriptor).ok());
  m = down->frames.OnFrame(descriptor);
  EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
}

TEST(FrameDataPlaneTest, ASendOnABrokenStreamIsUnavailable) {
  auto [up, down] = Ends();
  up->control.Cancel();
  absl::Status s = up->frames.Send(Activation(0, Pattern(10, 0)));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
}

// Two ShmDataPlanes on one segment, as the two ends of a link map it.
struct ShmPair {
  ShmPair() {
    std::tie(up, down) = Ends();
    absl::StatusOr<std::unique_ptr<ShmSegment>> created =
        ShmSegment::Create(kMinShmRingBytes, /*nonce=*/41);
    EXPECT_TRUE(created.ok()) << created.status();
    absl::StatusOr<std::unique_ptr<ShmSegment>> mapped = ShmSegment::OpenPeer(
        getpid(), (*created)->fd(), kMinShmRingBytes, 41, /*answer=*/42);
    EXPECT_TRUE(mapped.ok()) << mapped.status();
    (*created)->CloseFd();
    const int64_t chunk = kMinShmRingBytes / 8;
    up_plane = std::make_unique<ShmDataPlane>(
        up->context, std::make_shared<ShmChannel>(*std::move(created),
                                                  /*creator=*/true, chunk));
    down_plane = std::make_unique<ShmDataPlane>(
        down->context, std::make_shared<ShmChannel>(*std::move(mapped),
                                                    /*creator=*/false, chunk));
  }
  ~ShmPair() {
    // The planes first: their readers push into the ends' inboxes.
    up_plane.reset();
    down_plane.reset();
  }
  std::unique_ptr<End> up, down;
  std::unique_ptr<ShmDataPlane> up_plane, down_plane;
};

TEST(ShmDataPlaneTest, MessagesOfEverySizeArriveInOrderBitwise) {
  ShmPair p;
  EXPECT_EQ(p.up_plane->kind(), DataPlaneKind::kShm);
  // One chunk, several chunks, more than the whole ring.
  const std::vector<int64_t> sizes = {1, 1000, 100000, 700000};
  std::vector<Tensor> sent;
  std::thread sender([&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      sent.push_back(Pattern(sizes[i], static_cast<float>(i)));
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_TRUE(
          p.up_plane->Send(Activation(static_cast<int64_t>(i), sent[i])).ok());
    }
  });
  std::vector<Message> got;
  for (size_t i = 0; i < sizes.size(); ++i) {
    absl::StatusOr<Message> m = p.down->inbox.Pop();
    ASSERT_TRUE(m.ok()) << m.status();
    got.push_back(*std::move(m));
  }
  sender.join();
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(got[i].micro_batch, static_cast<int64_t>(i));
    EXPECT_TRUE(BitwiseEqual(got[i].tensor, sent[i])) << i;
  }
  // And back upstream.
  ASSERT_TRUE(p.down_plane->Send(Activation(9, sent[1])).ok());
  absl::StatusOr<Message> back = p.up->inbox.Pop();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(BitwiseEqual(back->tensor, sent[1]));
}

TEST(ShmDataPlaneTest, RefusesMessagesInFrames) {
  ShmPair p;
  gpipe::v1::Frame f;
  f.set_job_id(kJob);
  f.set_epoch(kEpoch);
  f.set_kind(gpipe::v1::GRAD_SQUARES);
  ReceivedFrame frame;
  ASSERT_TRUE(DecodeFrame(FrameToBuffer(f), &frame).ok());
  absl::StatusOr<std::optional<Message>> m = p.down_plane->OnFrame(frame);
  EXPECT_TRUE(absl::IsInvalidArgument(m.status())) << m.status();
  EXPECT_THAT(m.status().message(), HasSubstr("travel in shared memory"));
}

TEST(ShmDataPlaneTest, ClosingWakesABlockedSenderAndStopDrains) {
  ShmPair p;
  // Fill the ring with nobody reading: the sender blocks, then Close
  // fails it.
  std::thread sender([&] {
    absl::Status s;
    for (int i = 0; i < 100 && s.ok(); ++i) {
      s = p.up_plane->Send(Activation(i, Pattern(60000, 0)));
    }
    EXPECT_FALSE(s.ok());
  });
  // The reader moves at most the inbox's 16 messages, the ring holds a
  // few more: 100 cannot go through.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  p.up_plane->Close(absl::CancelledError("link closed"));
  sender.join();
  p.down->inbox.Close(absl::CancelledError("done"));
  p.down_plane->Stop(absl::CancelledError("done"), /*drain=*/false);
}

// Both ends negotiate: the upstream offers after OPEN, a reader per end
// hands offers and answers to its negotiator.
struct Negotiation {
  Negotiation(const DataPlaneOptions& upstream,
              const DataPlaneOptions& downstream) {
    std::tie(up, down) = Ends();
    down->negotiator.set_options(downstream);
    down_reader = std::thread([this] { Read(*down); });
    up_reader = std::thread([this] { Read(*up); });
    offered = up->negotiator.Offer(upstream, /*from_stage=*/0);
  }
  ~Negotiation() {
    up->control.Cancel();
    down->control.Cancel();
    up_reader.join();
    down_reader.join();
    up->negotiator.Stop(absl::CancelledError("done"), false);
    down->negotiator.Stop(absl::CancelledError("done"), false);
  }
  void Read(End& end) {
    for (;;) {
      std::optional<ReceivedFrame> f = end.NextFrame();
      if (!f.has_value()) break;
      const gpipe::v1::Frame& fields = f->fields();
      absl::Status s;
      if (fields.kind() == gpipe::v1::DATA_PLANE_OFFER) {
        s = end.negotiator.HandleOffer(fields);
        std::lock_guard<std::mutex> lock(mu);
        offer_status = s;
      } else if (fields.kind() == gpipe::v1::DATA_PLANE_ANSWER) {
        s = end.negotiator.HandleAnswer(fields);
        std::lock_guard<std::mutex> lock(mu);
        answer_status = s;
      }
    }
    end.negotiator.Close(absl::UnavailableError("closed"), absl::OkStatus());
  }
  absl::StatusOr<DataPlaneKind> Agreed() {
    return up->negotiator.WaitKind(std::chrono::seconds(5));
  }

  std::unique_ptr<End> up, down;
  std::thread up_reader, down_reader;
  absl::Status offered;
  std::mutex mu;
  absl::Status offer_status, answer_status;
};

TEST(PlaneNegotiatorTest, AutoOnBothCpuEndsAgreesOnSharedMemory) {
  Negotiation n(Planes(DataPlaneMode::kAuto), Planes(DataPlaneMode::kAuto));
  ASSERT_TRUE(n.offered.ok()) << n.offered;
  absl::StatusOr<DataPlaneKind> kind = n.Agreed();
  ASSERT_TRUE(kind.ok()) << kind.status();
  EXPECT_EQ(*kind, DataPlaneKind::kShm);
  EXPECT_TRUE(n.up->negotiator.refusal().empty());
  ASSERT_NE(n.up->negotiator.agreed(), nullptr);
  ASSERT_NE(n.down->negotiator.agreed(), nullptr);
  EXPECT_EQ(n.down->negotiator.agreed()->kind(), DataPlaneKind::kShm);
  absl::StatusOr<DataPlane*> plane = n.up->negotiator.AwaitPlane();
  ASSERT_TRUE(plane.ok());
  EXPECT_EQ(*plane, n.up->negotiator.agreed());
}

TEST(PlaneNegotiatorTest, APeerOnGrpcLeavesFramesWithATypedReason) {
  Negotiation n(Planes(DataPlaneMode::kAuto), Planes(DataPlaneMode::kGrpc));
  absl::StatusOr<DataPlaneKind> kind = n.Agreed();
  ASSERT_TRUE(kind.ok()) << kind.status();
  EXPECT_EQ(*kind, DataPlaneKind::kGrpc);
  const PlaneRefusal r = n.up->negotiator.refusal();
  EXPECT_EQ(r.cuda_ipc, "");  // a CPU stage never considers it
  EXPECT_EQ(r.shm, "the receiving worker runs --data_plane grpc");
  EXPECT_EQ(r.ToString(),
            "no shared memory: the receiving worker runs --data_plane grpc");
  EXPECT_EQ(n.up->negotiator.agreed(), nullptr);
  absl::StatusOr<DataPlane*> plane = n.up->negotiator.AwaitPlane();
  ASSERT_TRUE(plane.ok());
  EXPECT_EQ(*plane, &n.up->frames);
}

TEST(PlaneNegotiatorTest, AGpuStageWithoutCudaIpcSaysWhyBesideSharedMemory) {
  DataPlaneOptions gpu = Planes(DataPlaneMode::kAuto);
  gpu.on_gpu = true;
  Negotiation n(gpu, Planes(DataPlaneMode::kAuto));
  absl::StatusOr<DataPlaneKind> kind = n.Agreed();
  ASSERT_TRUE(kind.ok()) << kind.status();
  // Without a GPU in this process no device buffer can be made; with one,
  // the CPU downstream cannot open it. Either way: shared memory, and why
  // not CUDA IPC.
  EXPECT_EQ(*kind, DataPlaneKind::kShm);
  const PlaneRefusal r = n.up->negotiator.refusal();
  EXPECT_FALSE(r.cuda_ipc.empty());
  EXPECT_EQ(r.shm, "");
  EXPECT_THAT(r.ToString(), HasSubstr("no CUDA IPC: "));
}

TEST(PlaneNegotiatorTest, ForcedSharedMemoryThatThePeerRefusesFailsSend) {
  Negotiation n(Planes(DataPlaneMode::kShm), Planes(DataPlaneMode::kGrpc));
  ASSERT_TRUE(n.offered.ok()) << n.offered;
  absl::StatusOr<DataPlaneKind> kind = n.Agreed();
  EXPECT_TRUE(absl::IsFailedPrecondition(kind.status())) << kind.status();
  EXPECT_THAT(kind.status().message(),
              HasSubstr("--data_plane shm: the next stage cannot share memory "
                        "with this one: the receiving worker runs --data_plane grpc"));
  EXPECT_TRUE(
      absl::IsFailedPrecondition(n.up->negotiator.AwaitPlane().status()));
}

TEST(PlaneNegotiatorTest, ForcedSharedMemoryRefusesFramesWithoutAnOffer) {
  auto [up, down] = Ends();
  down->negotiator.set_options(Planes(DataPlaneMode::kShm));
  absl::Status s = down->negotiator.CheckFramesAllowed();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("without offering shared memory"));
  down->negotiator.set_options(Planes(DataPlaneMode::kAuto));
  EXPECT_TRUE(down->negotiator.CheckFramesAllowed().ok());
}

TEST(PlaneNegotiatorTest, SecondOffersStrayAnswersAndForeignJobsAreRefused) {
  Negotiation n(Planes(DataPlaneMode::kAuto), Planes(DataPlaneMode::kAuto));
  ASSERT_TRUE(n.Agreed().ok());
  gpipe::v1::Frame offer;
  offer.set_job_id(kJob);
  offer.set_epoch(kEpoch);
  offer.set_kind(gpipe::v1::DATA_PLANE_OFFER);
  // A second offer to the answering end, and any offer to the offering end.
  absl::Status s = n.down->negotiator.HandleOffer(offer);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  s = n.up->negotiator.HandleOffer(offer);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  // An answer once the answer came.
  gpipe::v1::Frame answer = offer;
  answer.set_kind(gpipe::v1::DATA_PLANE_ANSWER);
  answer.set_data_plane("shm");
  s = n.up->negotiator.HandleAnswer(answer);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("answer to no offer"));
  // Another job's or epoch's.
  answer.set_epoch(kEpoch + 1);
  s = n.up->negotiator.HandleAnswer(answer);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("epoch 4 on a link of job"));
}

TEST(PlaneNegotiatorTest, ALinkClosedBeforeTheAnswerIsUnavailable) {
  auto [up, down] = Ends();
  // Nobody reads the downstream end: the offer goes unanswered.
  ASSERT_TRUE(up->negotiator.Offer(Planes(DataPlaneMode::kAuto), 0).ok());
  absl::StatusOr<DataPlaneKind> kind =
      up->negotiator.WaitKind(std::chrono::milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(kind.status())) << kind.status();
  up->negotiator.Close(absl::CancelledError("link closed"), absl::OkStatus());
  kind = up->negotiator.WaitKind(std::chrono::seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(kind.status())) << kind.status();
  // Send then goes to frames (and fails on the closed stream).
  absl::StatusOr<DataPlane*> plane = up->negotiator.AwaitPlane();
  ASSERT_TRUE(plane.ok());
  EXPECT_EQ(*plane, &up->frames);
}

}  // namespace
}  // namespace gpipe
