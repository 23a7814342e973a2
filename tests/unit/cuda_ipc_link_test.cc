// The CUDA IPC plane between two processes on one GPU, as two stages use it:
// this process is the upstream stage, a forked child the downstream one that
// echoes every activation back as a gradient. Device tensors of one chunk,
// several chunks and more than the ring holds (back-pressure through
// releases) come back bitwise equal and on the device, with scalars in
// between. CUDA IPC handles cannot be opened by the process that made them,
// hence two processes; the fork comes before this process touches CUDA (a
// forked child may not use a CUDA context its parent made). Skipped without
// a GPU.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cli/child_process.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/tensor/device.h"
#include "services/transport/exchange_link.h"
#include "services/transport/exchange_method.h"
#include "tests/support/cuda_test_util.h"

namespace gpipe {
namespace {

using gpipe::v1::Frame;

constexpr char kJob[] = "job-cuda-ipc";
constexpr int64_t kEpoch = 1;
constexpr int64_t kRing = kMinShmRingBytes;  // 1 MiB per direction

DataPlaneOptions Planes() {
  DataPlaneOptions o;
  o.mode = DataPlaneMode::kCudaIpc;
  o.on_gpu = true;
  o.cuda_ipc_ring_bytes = kRing;
  return o;
}

// Whether a GPU is there, asked in a child so that this process stays
// free of CUDA until it has forked the downstream stage.
bool GpuPresentInChild() {
  absl::StatusOr<std::unique_ptr<ChildProcess>> probe = ChildProcess::Fork(
      "GPU probe", [] { return cuda_test::RealGpu() ? 0 : 1; });
  return probe.ok() && (*probe)->Wait() == 0;
}

// The downstream stage: echoes on one Exchange stream, then reports how it
// went as its exit code (0: every tensor arrived on the device on CUDA IPC).
class EchoService final : public ExchangeService {
 public:
  grpc::Status Exchange(grpc::ServerContext* context,
                        ExchangeServerStream* stream) override {
    absl::StatusOr<Frame> open = ReadOpenFrame(stream);
    if (!open.ok()) return ToGrpcStatus(open.status());
    ExchangeLink link(std::make_unique<ServerFrameStream>(context, stream),
                      open->job_id(), open->epoch(), /*capacity=*/8);
    link.set_data_plane(Planes());
    int rc = 0;
    std::thread echo([&] {
      for (;;) {
        absl::StatusOr<Message> m = link.Receive();
        if (!m.ok()) break;
        if (m->kind == MessageKind::kActivation) {
          if (!link.CarriesDeviceTensors() ||
              m->tensor.device() != Device::kCuda) {
            std::fprintf(stderr, "child: %s arrived on the host\n",
                         Describe(*m).c_str());
            rc = 3;
          }
          m->kind = MessageKind::kGradient;
        }
        if (!link.Send(std::move(*m)).ok()) break;
      }
      link.Release();
    });
    link.ReadLoop(/*cancel_on_reject=*/false);
    link.Close();
    echo.join();
    if (!link.read_status().ok()) {
      std::fprintf(stderr, "child: %s\n",
                   link.read_status().ToString().c_str());
      rc = 4;
    }
    std::lock_guard<std::mutex> lock(mu_);
    rc_ = rc;
    done_ = true;
    cv_.notify_all();
    return ToGrpcStatus(link.read_status());
  }

  int WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return done_; }))
      return 5;
    return rc_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  int rc_ = 0;
};

[[noreturn]] void RunDownstream(int port_pipe) {
  EchoService service;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (write(port_pipe, &port, sizeof(port)) != sizeof(port)) _exit(6);
  close(port_pipe);
  const int rc = service.WaitDone();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  _exit(rc);
}

Tensor Pattern(int64_t floats, float seed) {
  Tensor t = Tensor::Empty(Shape({floats}));
  for (int64_t i = 0; i < floats; ++i)
    t.f32()[i] = seed + 0.125f * static_cast<float>(i % 1013) - 3.0f;
  return t;
}

TEST(CudaIpcLinkTest, DeviceTensorsCrossProcessesBitwiseOnTheGpu) {
  if (!GpuPresentInChild()) GTEST_SKIP() << "no GPU";
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  absl::StatusOr<std::unique_ptr<ChildProcess>> child =
      ChildProcess::Fork("downstream stage", [&]() -> int {
        close(fds[0]);
        RunDownstream(fds[1]);
      });
  ASSERT_TRUE(child.ok()) << child.status();
  close(fds[1]);
  int port = 0;
  ASSERT_EQ(read(fds[0], &port, sizeof(port)), sizeof(port));
  close(fds[0]);
  {
    absl::StatusOr<std::unique_ptr<ExchangeClientLink>> link =
        ConnectDownstream("127.0.0.1:" + std::to_string(port), kJob, kEpoch, 0,
                          8, 10000, FrameCodec::kOneCopy, Planes());
    ASSERT_TRUE(link.ok()) << link.status();
    absl::StatusOr<DataPlaneKind> plane =
        (*link)->link().WaitDataPlane(std::chrono::seconds(20));
    ASSERT_TRUE(plane.ok()) << plane.status();
    EXPECT_EQ(*plane, DataPlaneKind::kCudaIpc);
    EXPECT_TRUE((*link)->CarriesDeviceTensors());
    // One float; one chunk; two chunks; three times the ring; and four
    // in flight at once.
    const int64_t sizes[] = {1, 1000, kRing / 4 + 3, 3 * kRing / 4};
    int64_t step = 0;
    for (int64_t floats : sizes) {
      const Tensor host = Pattern(floats, static_cast<float>(floats % 7));
      Message m;
      m.step = step;
      m.micro_batch = 0;
      m.tensor = host.To(Device::kCuda);
      ASSERT_TRUE((*link)->Send(std::move(m)).ok());
      Message norm;
      norm.kind = MessageKind::kGradSquares;
      norm.step = step;
      norm.scalar = 0.5 * static_cast<double>(floats);
      ASSERT_TRUE((*link)->Send(norm).ok());
      absl::StatusOr<Message> back = (*link)->Receive();
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->kind, MessageKind::kGradient);
      EXPECT_EQ(back->step, step);
      ASSERT_EQ(back->tensor.device(), Device::kCuda);
      EXPECT_TRUE(BitwiseEqual(back->tensor.To(Device::kCpu), host))
          << floats << " floats";
      absl::StatusOr<Message> scalar = (*link)->Receive();
      ASSERT_TRUE(scalar.ok()) << scalar.status();
      EXPECT_EQ(scalar->scalar, norm.scalar);
      ++step;
    }
    std::vector<Tensor> sent;
    for (int mb = 0; mb < 4; ++mb) {
      sent.push_back(Pattern(kRing / 16, static_cast<float>(mb)));
      Message m;
      m.step = step;
      m.micro_batch = mb;
      m.tensor = sent.back().To(Device::kCuda);
      ASSERT_TRUE((*link)->Send(std::move(m)).ok());
    }
    for (int mb = 0; mb < 4; ++mb) {
      absl::StatusOr<Message> back = (*link)->Receive();
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->micro_batch, mb);
      EXPECT_TRUE(BitwiseEqual(back->tensor.To(Device::kCpu), sent[mb]));
    }
    EXPECT_GT((*link)->bytes_sent(), 3 * kRing);
  }  // half-closes: the child's echo ends
  EXPECT_EQ((*child)->Wait(), 0)
      << "the downstream process " << (*child)->HowItEnded();
}

}  // namespace
}  // namespace gpipe
