// A stage's activation memory includes the tensors it receives: over a real
// ExchangeLink (frames, and the shared-memory plane whose one-chunk tensors
// stay in the ring) a received tensor is counted by the receiving thread's
// allocator while it is held and given up when freed, as a tensor the stage
// allocated itself would be. Before, tensors built on the link's reader
// thread were counted nowhere, and a cross-process stage's peak left out
// the micro-batch inputs it keeps for re-materialization.
#include <chrono>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "services/tensor/allocator.h"
#include "services/transport/exchange_link.h"
#include "tests/support/echo_stage.h"

namespace gpipe {
namespace {

constexpr char kJob[] = "job-memory";
constexpr int64_t kEpoch = 1;

DataPlaneOptions Planes(DataPlaneMode mode) {
  DataPlaneOptions o;
  o.mode = mode;
  o.ring_bytes = kMinShmRingBytes;
  o.chunk_bytes = 64 << 10;
  return o;
}

Tensor Pattern(int64_t floats) {
  Tensor t = Tensor::Empty(Shape({floats}));
  for (int64_t i = 0; i < floats; ++i) t.f32()[i] = 0.5f * (i % 101);
  return t;
}

class LinkMemoryTest : public ::testing::TestWithParam<DataPlaneMode> {};

TEST_P(LinkMemoryTest, ReceivedTensorsAreCountedByTheReceiverWhileHeld) {
  test_support::EchoStageServer server(Planes(DataPlaneMode::kAuto));
  absl::StatusOr<std::unique_ptr<ExchangeClientLink>> link =
      ConnectDownstream(server.address(), kJob, kEpoch, 0, 8, 5000,
                        FrameCodec::kOneCopy, Planes(GetParam()));
  ASSERT_TRUE(link.ok()) << link.status();
  absl::StatusOr<DataPlaneKind> plane =
      (*link)->link().WaitDataPlane(std::chrono::seconds(5));
  ASSERT_TRUE(plane.ok()) << plane.status();
  EXPECT_EQ(*plane, GetParam() == DataPlaneMode::kShm ? DataPlaneKind::kShm
                                                      : DataPlaneKind::kGrpc);

  // One float, one 60 KB chunk (kept in the ring on shm), and 400 KB in
  // several chunks (copied out of it).
  const std::vector<int64_t> sizes = {1, 15000, 100000};
  std::vector<Tensor> sent;
  for (int64_t n : sizes) sent.push_back(Pattern(n));

  CountingAllocator stage(DefaultCpuAllocator());
  std::vector<Tensor> held;
  int64_t held_bytes = 0;
  {
    AllocatorScope scope(&stage);
    for (size_t i = 0; i < sent.size(); ++i) {
      Message m;
      m.kind = MessageKind::kActivation;
      m.micro_batch = static_cast<int64_t>(i);
      m.tensor = sent[i];
      ASSERT_TRUE((*link)->Send(std::move(m)).ok());
      absl::StatusOr<Message> back = (*link)->Receive();
      ASSERT_TRUE(back.ok()) << back.status();
      ASSERT_TRUE(BitwiseEqual(back->tensor, sent[i]));
      held_bytes += static_cast<int64_t>(back->tensor.nbytes());
      held.push_back(std::move(back->tensor));
      EXPECT_EQ(stage.current_bytes(), held_bytes) << "after " << i + 1;
    }
    // Counting twice (a second Receive path, a copy of the tensor) adds
    // nothing.
    Tensor again = held[1];
    again.CountIn(&stage);
    EXPECT_EQ(stage.current_bytes(), held_bytes);
  }
  EXPECT_EQ(stage.peak_bytes(), held_bytes);
  held.clear();
  EXPECT_EQ(stage.current_bytes(), 0);
  EXPECT_EQ(stage.peak_bytes(), held_bytes);
}

INSTANTIATE_TEST_SUITE_P(Planes, LinkMemoryTest,
                         ::testing::Values(DataPlaneMode::kGrpc,
                                           DataPlaneMode::kShm),
                         [](const auto& info) {
                           return info.param == DataPlaneMode::kShm
                                      ? std::string("Shm")
                                      : std::string("Grpc");
                         });

}  // namespace
}  // namespace gpipe
