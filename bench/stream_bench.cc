// Tensor streaming between two worker processes over loopback: our gRPC link
// (ExchangeLink over one Exchange stream, exactly as two stages use it) against
// a plain TCP socket measured in the same run, which is what this machine's
// loopback can do at best. The link runs twice: with the one-copy frame
// codec the workers send with, and with the copying one (payloads through
// Frame.payload strings: 4 copies per byte) for comparison. A third run
// uses the shared-memory data plane (the same link, messages through a
// ring in a memfd segment, notified through the segment), measured against
// memcpy's bandwidth on this machine (one buffer into another, same sizes).
//   Throughput: the parent sends K float32 tensors of S bytes as activations;
//   the child answers once after it has received all K, so the timer covers
//   full delivery. TCP: the same K*S bytes, then a 1-byte ack.
//   Latency: a tensor (64 KiB by default) echoed back and forth; per-hop
//   latency is the median round trip / 2.
//   Send-then-compute: the parent sends one tensor, then computes (a busy
//   loop of --compute-ms) before the next, as a stage does; it reports the
//   time inside Send and the wall time per send beyond the compute, for
//   one-copy and zero-copy frames and for shared memory.
// The child process is the receiver (gRPC server and TCP listener on
// 127.0.0.1); it dies with the parent (PR_SET_PDEATHSIG).
// Both processes keep freed memory in the heap, as gpipe-worker does
// (services/core/memory.h); --glibc-malloc shows glibc's defaults instead.
// Usage: stream_bench [--sizes 64K,256K,1M,4M,16M,64M] [--seconds 1]
//                     [--latency-size 64K] [--glibc-malloc] [--no-copying]
//                     [--shm-ring 32M] [--shm-chunk 4M]
//                     [--compute-sizes 1M,4M] [--compute-sends 30]
//                     [--compute-ms 2] [--shm-only]
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/args.h"
#include "bench/timing.h"
#include "cli/child_process.h"
#include "grpcpp/grpcpp.h"
#include "services/core/memory.h"
#include "services/transport/exchange_link.h"
#include "services/transport/exchange_method.h"
#include "services/transport/frame_codec.h"

namespace gpipe::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kJob[] = "stream-bench";
constexpr int64_t kEpoch = 1;
// The OPEN frame's from_stage picks what the child does with the stream
// (mode + kCopyingFlag when the link uses the copying codec).
constexpr int64_t kSinkMode = 0;  // count tensors, answer each barrier
constexpr int64_t kEchoMode = 1;  // send every tensor straight back
constexpr int64_t kCopyingFlag = 2;
// The parent offers shared memory (the child accepts whatever is offered).
// Bytes per throughput round (at least 2 tensors), and bounds on every loop.
constexpr int64_t kRoundBytes = 32 << 20;
constexpr int kMaxRounds = 1000;
constexpr int kMaxRoundTrips = 20000;

[[noreturn]] void Die(const std::string& what) {
  std::fflush(stdout);
  std::fprintf(stderr, "stream_bench: %s\n", what.c_str());
  ::_exit(1);  // gRPC's threads may still run: skip static destructors
}

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// "64K", "1M", "4096" -> bytes (a positive multiple of 4, at most 1 GiB).
int64_t ParseSize(const std::string& s) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  int64_t mult = 1;
  switch (*end) {
    case 'K':
    case 'k':
      mult = int64_t{1} << 10, ++end;
      break;
    case 'M':
    case 'm':
      mult = int64_t{1} << 20, ++end;
      break;
    case 'G':
    case 'g':
      mult = int64_t{1} << 30, ++end;
      break;
  }
  if (*end != '\0' || v <= 0 || v > (int64_t{1} << 30) / mult ||
      v * mult % 4 != 0) {
    Die(absl::StrCat("bad size '", s,
                     "': want a positive multiple of 4 bytes up to 1G, e.g. "
                     "64K or 4M"));
  }
  return v * mult;
}

// The string value of option --name (Args has no string accessor).
std::string StringOption(int argc, char** argv, const std::string& name,
                         std::string fallback) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    std::replace(a.begin(), a.end(), '_', '-');
    if (a == "--" + name && i + 1 < argc) fallback = argv[++i];
    if (a.rfind("--" + name + "=", 0) == 0) {
      fallback = std::string(argv[i]).substr(name.size() + 3);
    }
  }
  return fallback;
}

std::string SizeName(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB");
  }
  if (bytes >= 1024 && bytes % 1024 == 0)
    return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

// --- plain TCP -----------------------------------------------------------

bool ReadFull(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteFull(int fd, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

void NoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// What the parent asks of the child's TCP side, before each round.
struct TcpRequest {
  uint64_t mode;   // kSinkMode or kEchoMode
  uint64_t size;   // bytes per tensor
  uint64_t count;  // tensors
};

// Sink: reads count*size bytes, then acks with one byte. Echo: reads and
// writes back `size` bytes, `count` times.
void ServeTcp(int fd) {
  NoDelay(fd);
  std::vector<char> buf;
  TcpRequest req;
  while (ReadFull(fd, &req, sizeof(req))) {
    if (req.size == 0 || req.size > (uint64_t{1} << 30)) break;
    buf.resize(req.size);
    bool ok = true;
    for (uint64_t i = 0; ok && i < req.count; ++i) {
      ok = ReadFull(fd, buf.data(), req.size);
      if (ok && req.mode == kEchoMode) ok = WriteFull(fd, buf.data(), req.size);
    }
    const char ack = 'k';
    if (!ok || (req.mode == kSinkMode && !WriteFull(fd, &ack, 1))) break;
  }
  ::close(fd);
}

// Listens on 127.0.0.1 at a free port; returns the fd and sets `port`.
int ListenTcp(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ||
      ::listen(fd, 4) ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len)) {
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

int ConnectTcp(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Die(absl::StrCat("cannot connect to the child's TCP port ", port, ": ",
                     std::strerror(errno)));
  }
  NoDelay(fd);
  return fd;
}

// --- the child: a bench-local Stage service -------------------------------

// Wraps each Exchange stream in a ExchangeLink, as worker/stage_service.cc
// does, and drains it on a second thread: in sink mode it counts the tensors
// and answers each GRAD_SQUARES barrier with a one-element GRADIENT holding
// that count; in echo mode it sends every tensor straight back as a GRADIENT.
class BenchStageService final : public ExchangeService {
 public:
  grpc::Status Exchange(grpc::ServerContext* context,
                        ExchangeServerStream* stream) override {
    absl::StatusOr<gpipe::v1::Frame> open = ReadOpenFrame(stream);
    if (!open.ok()) return ToGrpcStatus(open.status());
    const FrameCodec codec = (open->from_stage() & kCopyingFlag) != 0
                                 ? FrameCodec::kCopying
                                 : FrameCodec::kZeroCopy;
    ExchangeLink link(std::make_unique<ServerFrameStream>(context, stream),
                      open->job_id(), open->epoch(), /*capacity=*/64, codec);
    DataPlaneOptions planes;
    planes.mode = DataPlaneMode::kAuto;
    link.set_data_plane(planes);
    const bool echo = (open->from_stage() & ~kCopyingFlag) == kEchoMode;
    std::thread worker([&link, echo] {
      int64_t tensors = 0;
      for (;;) {
        absl::StatusOr<Message> m = link.Receive();
        if (!m.ok()) break;
        if (m->kind == MessageKind::kActivation) {
          ++tensors;
          if (!echo) continue;
          m->kind = MessageKind::kGradient;
          if (!link.Send(std::move(*m)).ok()) break;
        } else if (m->kind == MessageKind::kGradSquares) {
          Message reply;
          reply.kind = MessageKind::kGradient;
          reply.step = m->step;
          reply.tensor =
              Tensor::Filled(Shape({1}), static_cast<float>(tensors));
          tensors = 0;
          if (!link.Send(std::move(reply)).ok()) break;
        }
      }
      link.Release();
    });
    link.ReadLoop(/*cancel_on_reject=*/false);
    worker.join();
    const absl::Status why = link.read_status();
    return grpc::Status(static_cast<grpc::StatusCode>(why.code()),
                        std::string(why.message()));
  }
};

// Serves gRPC and TCP until the parent closes `control_fd` (or dies).
[[noreturn]] void RunChild(int ports_fd, int control_fd) {
  BenchStageService service;
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &grpc_port);
  builder.RegisterService(&service);
  // As worker/main.cc builds the worker's server.
  builder.SetMaxReceiveMessageSize(4 << 20);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  int tcp_port = 0;
  const int listen_fd = ListenTcp(&tcp_port);
  if (server == nullptr || grpc_port == 0 || listen_fd < 0) {
    std::fprintf(stderr, "stream_bench child: cannot listen\n");
    ::_exit(1);
  }
  std::thread([listen_fd] {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0 && errno == EINTR) continue;
      if (fd < 0) return;
      std::thread(ServeTcp, fd).detach();
    }
  }).detach();
  const std::string ports = absl::StrCat(grpc_port, " ", tcp_port, "\n");
  WriteFull(ports_fd, ports.data(), ports.size());
  ::close(ports_fd);
  char c;
  for (;;) {
    const ssize_t r = ::read(control_fd, &c, 1);
    if (r == 0 || (r < 0 && errno != EINTR)) break;
  }
  ::_exit(0);  // the parent is done: no orderly shutdown needed
}

// --- the parent: measurements --------------------------------------------

// Runs timed rounds of `bytes_per_round` (after one untimed warm-up round)
// until `seconds` have passed (at least 3 rounds, at most kMaxRounds);
// returns the median round's GB/s (1e9 bytes/s).
template <typename Round>
double MeasureGBps(int64_t bytes_per_round, double seconds, Round&& round) {
  round();
  std::vector<double> gbps;
  const Clock::time_point start = Clock::now();
  while (gbps.size() < 3 ||
         (Since(start) < seconds && gbps.size() < kMaxRounds)) {
    gbps.push_back(static_cast<double>(bytes_per_round) / TimeSeconds(round) /
                   1e9);
  }
  return Median(gbps);
}

struct Latency {
  double median_us = 0, p90_us = 0;
  int round_trips = 0;
};

// Per-hop latency: round trip / 2, over round trips for `seconds` (after 20
// untimed ones; at least 50, at most kMaxRoundTrips).
template <typename RoundTrip>
Latency MeasureLatency(double seconds, RoundTrip&& round_trip) {
  for (int i = 0; i < 20; ++i) round_trip();
  std::vector<double> hop_us;
  const Clock::time_point start = Clock::now();
  while (hop_us.size() < 50 ||
         (Since(start) < seconds && hop_us.size() < kMaxRoundTrips)) {
    hop_us.push_back(TimeSeconds(round_trip) * 1e6 / 2);
  }
  Latency l;
  l.median_us = Median(hop_us);
  std::sort(hop_us.begin(), hop_us.end());
  l.p90_us = hop_us[hop_us.size() * 9 / 10];
  l.round_trips = static_cast<int>(hop_us.size());
  return l;
}

Tensor PatternTensor(int64_t bytes) {
  Tensor t = Tensor::Empty(Shape({bytes / 4}));
  float* p = t.f32();
  for (int64_t i = 0; i < bytes / 4; ++i) p[i] = static_cast<float>(i % 1000);
  return t;
}

// A barrier: the child answers once it has received all `count` tensors
// sent since the last one.
void SinkBarrier(Link& link, int64_t count, int64_t step) {
  Message barrier;
  barrier.kind = MessageKind::kGradSquares;
  barrier.step = step;
  if (absl::Status s = link.Send(std::move(barrier)); !s.ok()) {
    Die(std::string(s.message()));
  }
  absl::StatusOr<Message> ack = link.Receive();
  if (!ack.ok()) Die(std::string(ack.status().message()));
  if (ack->kind != MessageKind::kGradient || !ack->tensor.defined() ||
      ack->tensor.f32()[0] != static_cast<float>(count)) {
    Die(absl::StrCat("the child acknowledged a round of ", count,
                     " tensors with ", Describe(*ack)));
  }
}

// K tensors of `t`, then a barrier.
void GrpcSinkRound(Link& link, const Tensor& t, int64_t count, int64_t step) {
  for (int64_t i = 0; i < count; ++i) {
    Message m;
    m.kind = MessageKind::kActivation;
    m.step = step;
    m.micro_batch = i;
    m.tensor = t;
    if (absl::Status s = link.Send(std::move(m)); !s.ok()) {
      Die(std::string(s.message()));
    }
  }
  SinkBarrier(link, count, step);
}

Tensor GrpcEcho(Link& link, const Tensor& t) {
  Message m;
  m.kind = MessageKind::kActivation;
  m.tensor = t;
  if (absl::Status s = link.Send(std::move(m)); !s.ok()) {
    Die(std::string(s.message()));
  }
  absl::StatusOr<Message> back = link.Receive();
  if (!back.ok()) Die(std::string(back.status().message()));
  return back->tensor;
}

void TcpSinkRound(int fd, const std::vector<char>& buf, int64_t count) {
  const TcpRequest req{kSinkMode, buf.size(), static_cast<uint64_t>(count)};
  bool ok = WriteFull(fd, &req, sizeof(req));
  for (int64_t i = 0; ok && i < count; ++i) {
    ok = WriteFull(fd, buf.data(), buf.size());
  }
  char ack = 0;
  if (!ok || !ReadFull(fd, &ack, 1)) Die("the child's TCP side went away");
}

void TcpEcho(int fd, std::vector<char>& buf) {
  const TcpRequest req{kEchoMode, buf.size(), 1};
  if (!WriteFull(fd, &req, sizeof(req)) ||
      !WriteFull(fd, buf.data(), buf.size()) ||
      !ReadFull(fd, buf.data(), buf.size())) {
    Die("the child's TCP side went away");
  }
}

// K copies of `src` into one reused buffer (memcpy's bandwidth, warm).
void MemcpyRound(const std::vector<char>& src, std::vector<char>& dst,
                 int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(dst.data(), src.data(), src.size());
    // Keep the compiler from dropping copies nobody reads.
    asm volatile("" : : "r"(dst.data()) : "memory");
  }
}

struct Row {
  int64_t size;
  double grpc_gbps, copying_gbps, tcp_gbps, shm_gbps, memcpy_gbps;
};

// A link to the child in `mode` with `codec`; with `planes.mode` shm the
// tensors go through shared memory (checked: the child must have mapped it).
std::unique_ptr<Link> Connect(const std::string& address, int64_t mode,
                              FrameCodec codec,
                              const DataPlaneOptions& planes = {}) {
  absl::StatusOr<std::unique_ptr<ExchangeClientLink>> link = ConnectDownstream(
      address, kJob, kEpoch,
      mode + (codec == FrameCodec::kCopying ? kCopyingFlag : 0), 64, 5000,
      codec, planes);
  if (!link.ok()) Die(std::string(link.status().message()));
  absl::StatusOr<DataPlaneKind> plane =
      (*link)->link().WaitDataPlane(std::chrono::seconds(5));
  if (!plane.ok()) Die(std::string(plane.status().message()));
  if (planes.mode == DataPlaneMode::kShm && *plane != DataPlaneKind::kShm) {
    Die("the child did not map the shared-memory segment");
  }
  return std::move(*link);
}

// Per-hop latency over a fresh echo link with `codec`; checks the echo first.
Latency GrpcLatency(const std::string& address, FrameCodec codec,
                    int64_t latency_size, double seconds,
                    const DataPlaneOptions& planes = {}) {
  std::unique_ptr<Link> echo = Connect(address, kEchoMode, codec, planes);
  const Tensor t = PatternTensor(latency_size);
  if (!BitwiseEqual(GrpcEcho(*echo, t), t)) {
    Die("the echoed tensor differs from the one sent");
  }
  return MeasureLatency(seconds, [&] { GrpcEcho(*echo, t); });
}

// Spins for `d` doing float work, as a stage computes between sends.
void ComputeFor(std::chrono::microseconds d) {
  const Clock::time_point end = Clock::now() + d;
  volatile float acc = 0;
  while (Clock::now() < end) {
    for (int i = 0; i < 256; ++i) acc = acc * 0.999f + 1.0f;
  }
}

struct ComputeRow {
  double send_median_us = 0, send_p90_us = 0;
  double gbps = 0;
  double cost_us = 0;  // wall time per send beyond the compute itself
};

// Send-then-compute: `sends` tensors, each followed by `compute` of busy
// work, then the sink's barrier (the timer covers full delivery). Send's
// own duration is what the stage waits before it can compute again.
ComputeRow SendThenCompute(Link& link, const Tensor& t, int sends,
                           std::chrono::microseconds compute, int64_t step) {
  std::vector<double> send_us;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < sends; ++i) {
    Message m;
    m.kind = MessageKind::kActivation;
    m.step = step;
    m.micro_batch = i;
    m.tensor = t;
    const Clock::time_point sent = Clock::now();
    if (absl::Status s = link.Send(std::move(m)); !s.ok()) {
      Die(std::string(s.message()));
    }
    send_us.push_back(Since(sent) * 1e6);
    ComputeFor(compute);
  }
  SinkBarrier(link, sends, step);  // all `sends` delivered
  const double wall = Since(start);
  ComputeRow r;
  r.send_median_us = Median(send_us);
  std::sort(send_us.begin(), send_us.end());
  r.send_p90_us = send_us[send_us.size() * 9 / 10];
  r.gbps = static_cast<double>(t.nbytes()) * sends / wall / 1e9;
  r.cost_us = (wall - sends * compute.count() * 1e-6) / sends * 1e6;
  return r;
}

// The send-then-compute table: for each size, one-copy and zero-copy frames
// and the shared-memory plane, each on its own sink link.
void RunSendThenCompute(const std::string& address,
                        const std::vector<int64_t>& sizes, int sends,
                        std::chrono::microseconds compute,
                        const DataPlaneOptions& shm) {
  struct Plane {
    const char* name;
    FrameCodec codec;
    DataPlaneOptions planes;
  };
  const Plane planes[] = {{"grpc one-copy", FrameCodec::kOneCopy, {}},
                          {"grpc zero-copy", FrameCodec::kZeroCopy, {}},
                          {"shm", FrameCodec::kZeroCopy, shm}};
  std::printf(
      "\nsend-then-compute: %d sends, each followed by %.1f ms of busy "
      "compute (a stage's\nforward), then a barrier; send = time inside "
      "Send, cost = (wall - compute) / send\n",
      sends, compute.count() / 1000.0);
  std::printf("%-9s %-15s %14s %12s %9s %14s\n", "size", "plane",
              "send median us", "send p90 us", "GB/s", "cost/send us");
  int64_t step = 1 << 20;
  for (int64_t size : sizes) {
    const Tensor t = PatternTensor(size);
    for (const Plane& p : planes) {
      std::unique_ptr<Link> link =
          Connect(address, kSinkMode, p.codec, p.planes);
      SendThenCompute(*link, t, 3, compute, step++);  // warm-up
      const ComputeRow r = SendThenCompute(*link, t, sends, compute, step++);
      std::printf("%-9s %-15s %14.1f %12.1f %9.2f %14.1f\n",
                  SizeName(size).c_str(), p.name, r.send_median_us,
                  r.send_p90_us, r.gbps, r.cost_us);
      std::fflush(stdout);
    }
  }
}

struct ComputeOptions {
  std::vector<int64_t> sizes;
  int sends = 0;  // 0: no send-then-compute table
  std::chrono::microseconds compute{0};
};

int RunParent(int ports_fd, const std::vector<int64_t>& sizes, double seconds,
              int64_t latency_size, bool mallopt, bool copying,
              const DataPlaneOptions& shm, const ComputeOptions& compute,
              bool shm_only) {
  pollfd pfd{ports_fd, POLLIN, 0};
  char line[64] = {};
  if (::poll(&pfd, 1, 10000) != 1 ||
      ::read(ports_fd, line, sizeof(line) - 1) <= 0) {
    Die("the child did not report its ports within 10 s");
  }
  int grpc_port = 0, tcp_port = 0;
  if (std::sscanf(line, "%d %d", &grpc_port, &tcp_port) != 2) {
    Die("the child reported no ports");
  }
  const std::string address = absl::StrCat("127.0.0.1:", grpc_port);

  std::printf(
      "stream_bench: tensors from this process to a child process over "
      "127.0.0.1,\n"
      "  gRPC: ExchangeLink over one Exchange stream (%lld KiB frames), as two "
      "stages use it\n"
      "        (one-copy codec, as gpipe-worker sends; 'copying': the same "
      "link with payloads through protobuf strings)\n"
      "  TCP:  the same bytes through one plain socket (TCP_NODELAY), the "
      "loopback's limit\n"
      "  shm:  the same ExchangeLink on the shared-memory plane (rings of %lld "
      "MiB, chunks of %lld KiB);\n"
      "        memcpy: one buffer into another on this machine, the bound "
      "for any copy\n"
      "  ~%.1f s per figure, median of rounds of >= %lld MiB; GB/s = 1e9 "
      "bytes/s\n"
      "  malloc: %s\n\n",
      static_cast<long long>(kMaxChunkBytes >> 10),
      static_cast<long long>(shm.ring_bytes >> 20),
      static_cast<long long>(shm.chunk_bytes >> 10), seconds,
      static_cast<long long>(kRoundBytes >> 20),
      mallopt ? "freed memory kept (no mmap below 256 MiB, no trim below "
                "1 GiB, 1 arena), as gpipe-worker runs"
              : "glibc defaults (--glibc-malloc)");
  std::fflush(stdout);

  // The codec gpipe-worker sends with (the zero-copy one waits for gRPC to
  // release each slice: see the send-then-compute table).
  std::unique_ptr<Link> sink =
      Connect(address, kSinkMode, FrameCodec::kOneCopy);
  std::unique_ptr<Link> copying_sink =
      copying ? Connect(address, kSinkMode, FrameCodec::kCopying) : nullptr;
  std::unique_ptr<Link> shm_sink =
      Connect(address, kSinkMode, FrameCodec::kZeroCopy, shm);
  const int tcp = ConnectTcp(tcp_port);

  std::printf("%-9s %10s %10s %10s %9s %9s  %-6s %9s %11s %10s  %s\n", "size",
              "gRPC GB/s", "copying", "TCP GB/s", "gRPC/TCP", "gRPC/copy",
              ">=0.50", "shm GB/s", "memcpy GB/s", "shm/memcpy", ">=0.70");
  std::vector<Row> rows;
  int64_t step = 0;
  for (int64_t size : sizes) {
    const int64_t count = std::max<int64_t>(2, kRoundBytes / size);
    const Tensor t = PatternTensor(size);
    const std::vector<char> buf(static_cast<size_t>(size), 'x');
    Row r{size, 0, 0, 0, 0, 0};
    if (!shm_only) {
      r.grpc_gbps = MeasureGBps(size * count, seconds, [&] {
        GrpcSinkRound(*sink, t, count, step++);
      });
    }
    if (copying && !shm_only) {
      r.copying_gbps = MeasureGBps(size * count, seconds, [&] {
        GrpcSinkRound(*copying_sink, t, count, step++);
      });
    }
    if (!shm_only) {
      r.tcp_gbps = MeasureGBps(size * count, seconds,
                               [&] { TcpSinkRound(tcp, buf, count); });
    }
    r.shm_gbps = MeasureGBps(size * count, seconds, [&] {
      GrpcSinkRound(*shm_sink, t, count, step++);
    });
    std::vector<char> dst(buf.size());
    r.memcpy_gbps = MeasureGBps(size * count, seconds,
                                [&] { MemcpyRound(buf, dst, count); });
    const double ratio = r.grpc_gbps / r.tcp_gbps;
    const double shm_ratio = r.shm_gbps / r.memcpy_gbps;
    std::printf(
        "%-9s %10.2f %10.2f %10.2f %9.2f %9.2f  %-6s %9.2f %11.2f %10.2f  %s\n",
        SizeName(size).c_str(), r.grpc_gbps, r.copying_gbps, r.tcp_gbps, ratio,
        copying ? r.grpc_gbps / r.copying_gbps : 0.0,
        size < (1 << 20) || shm_only ? "-" : (ratio >= 0.5 ? "ok" : "MISSED"),
        r.shm_gbps, r.memcpy_gbps, shm_ratio,
        size < (1 << 20) ? "-" : (shm_ratio >= 0.7 ? "ok" : "MISSED"));
    std::fflush(stdout);
    rows.push_back(r);
  }
  sink.reset();  // half-closes and waits for the child's handler
  copying_sink.reset();
  shm_sink.reset();

  const Latency grpc_lat =
      GrpcLatency(address, FrameCodec::kOneCopy, latency_size, seconds);
  const Latency copying_lat =
      copying
          ? GrpcLatency(address, FrameCodec::kCopying, latency_size, seconds)
          : Latency{};
  const Latency shm_lat =
      GrpcLatency(address, FrameCodec::kZeroCopy, latency_size, seconds, shm);
  std::vector<char> buf(static_cast<size_t>(latency_size), 'x');
  const Latency tcp_lat = MeasureLatency(seconds, [&] { TcpEcho(tcp, buf); });
  ::close(tcp);

  std::printf("\nper-hop latency of a %s tensor (round trip / 2):\n",
              SizeName(latency_size).c_str());
  std::printf("  gRPC %8.1f us median, %8.1f us p90 (%d round trips)  %s\n",
              grpc_lat.median_us, grpc_lat.p90_us, grpc_lat.round_trips,
              latency_size != (64 << 10) ? ""
              : grpc_lat.median_us < 200 ? "goal < 200 us: ok"
                                         : "goal < 200 us: MISSED");
  if (copying) {
    std::printf(
        "  gRPC %8.1f us median, %8.1f us p90 (%d round trips), copying "
        "codec\n",
        copying_lat.median_us, copying_lat.p90_us, copying_lat.round_trips);
  }
  std::printf("  shm  %8.1f us median, %8.1f us p90 (%d round trips)\n",
              shm_lat.median_us, shm_lat.p90_us, shm_lat.round_trips);
  std::printf("  TCP  %8.1f us median, %8.1f us p90 (%d round trips)\n",
              tcp_lat.median_us, tcp_lat.p90_us, tcp_lat.round_trips);
  if (compute.sends > 0) {
    RunSendThenCompute(address, compute.sizes, compute.sends, compute.compute,
                       shm);
  }
  std::printf(
      "\nHow to read: GB/s is K tensors of the row's size sent back to back, "
      "over the time until\n"
      "the receiver has them all (gRPC: reassembled into tensors; TCP: bytes "
      "read into one\n"
      "reused buffer). gRPC/TCP is the share of the loopback's own throughput "
      "that our link\n"
      "reaches (goal >= 0.50 from 1 MiB); gRPC/copy is the one-copy codec's "
      "speed-up over\n"
      "the copying one (one copy sending, one receiving; against 2 + 2).\n"
      "shm/memcpy is the shared-memory plane's share of one memcpy (goal >= "
      "0.70 from 1 MiB):\n"
      "one copy per byte (tensor -> ring in the sender; a tensor of one "
      "chunk is the receiver's\n"
      "tensor in place, larger ones are copied out), notified through the "
      "segment, so the\n"
      "sender and the receiver share the 2 cores with everything else on "
      "them.\n"
      "send-then-compute: a stage sends and goes back to computing; 'send' "
      "is how long Send\n"
      "kept it from computing, 'cost' what each send added to the wall time "
      "(delivery included).\n"
      "Per-hop latency is what one activation or gradient of that size costs "
      "between\n"
      "neighbouring stages (goal < 200 us for 64 KiB). Both processes share "
      "this machine's\n"
      "cores, so the figures include the receiver's CPU work.\n"
      "Many page faults per MiB moved mean buffers come fresh from the kernel "
      "each time:\n"
      "compare a run with --glibc-malloc.\n");
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace gpipe::bench

int main(int argc, char** argv) {
  using namespace gpipe::bench;
  Args args(argc, argv,
            {"sizes", "seconds", "latency-size", "shm-ring", "shm-chunk",
             "compute-sizes", "compute-sends", "compute-ms"},
            {"glibc-malloc", "no-copying", "shm-only"});
  if (!args.ok() || !args.positional().empty()) {
    std::fprintf(stderr,
                 "%s\nusage: stream_bench [--sizes 64K,256K,1M,4M,16M,64M] "
                 "[--seconds 1] [--latency-size 64K] [--glibc-malloc] "
                 "[--no-copying] [--shm-ring 32M] [--shm-chunk 4M] "
                 "[--compute-sizes 1M,4M] [--compute-sends 30] "
                 "[--compute-ms 2] [--shm-only]\n",
                 args.error().c_str());
    return 2;
  }
  std::vector<int64_t> sizes;
  const std::string list =
      StringOption(argc, argv, "sizes", "64K,256K,1M,4M,16M,64M");
  for (size_t at = 0; at <= list.size();) {
    const size_t comma = std::min(list.find(',', at), list.size());
    sizes.push_back(ParseSize(list.substr(at, comma - at)));
    at = comma + 1;
  }
  const int64_t latency_size =
      ParseSize(StringOption(argc, argv, "latency-size", "64K"));
  const double seconds = args.Double("seconds", 1.0);
  ComputeOptions compute;
  const std::string compute_list =
      StringOption(argc, argv, "compute-sizes", "1M,4M");
  for (size_t at = 0; at <= compute_list.size();) {
    const size_t comma =
        std::min(compute_list.find(',', at), compute_list.size());
    compute.sizes.push_back(ParseSize(compute_list.substr(at, comma - at)));
    at = comma + 1;
  }
  const double sends = args.Double("compute-sends", 30);
  const double compute_ms = args.Double("compute-ms", 2);
  if (!(sends >= 0 && sends <= 1000) ||
      !(compute_ms > 0 && compute_ms <= 100)) {
    Die("--compute-sends must be in [0, 1000] and --compute-ms in (0, 100]");
  }
  compute.sends = static_cast<int>(sends);
  compute.compute =
      std::chrono::microseconds(static_cast<int64_t>(compute_ms * 1000));
  gpipe::DataPlaneOptions shm;
  shm.mode = gpipe::DataPlaneMode::kShm;
  shm.ring_bytes = ParseSize(StringOption(argc, argv, "shm-ring", "32M"));
  shm.chunk_bytes = ParseSize(StringOption(argc, argv, "shm-chunk", "4M"));
  if (absl::Status s = gpipe::ValidateDataPlaneOptions(shm); !s.ok()) {
    Die(std::string(s.message()));
  }
  if (!(seconds > 0 && seconds <= 60)) Die("--seconds must be in (0, 60]");

  // As gpipe-worker does (services/core/memory.h), unless asked to show
  // glibc's defaults for comparison.
  const bool mallopt = !args.Has("glibc-malloc");
  if (mallopt) gpipe::KeepFreedMemory();  // before fork: both processes
  ::signal(SIGPIPE, SIG_IGN);
  // A watchdog: no run may hang (SIGALRM ends the process, the child follows).
  ::alarm(static_cast<unsigned>(60 + 12 * seconds * (sizes.size() + 2) +
                                3 * compute.sizes.size() * 2 * compute.sends *
                                    compute_ms / 1000));

  int ports[2], control[2];
  if (::pipe2(ports, O_CLOEXEC) != 0 || ::pipe2(control, O_CLOEXEC) != 0) {
    Die("pipe failed");
  }
  // Fork before anything starts gRPC's threads in this process.
  absl::StatusOr<std::unique_ptr<gpipe::ChildProcess>> child =
      gpipe::ChildProcess::Fork("receiver", [&]() -> int {
        ::close(ports[0]);
        ::close(control[1]);
        RunChild(ports[1], control[0]);
      });
  if (!child.ok()) Die("fork failed");
  ::close(ports[1]);
  ::close(control[0]);
  const int rc =
      RunParent(ports[0], sizes, seconds, latency_size, mallopt,
                !args.Has("no-copying"), shm, compute, args.Has("shm-only"));
  ::close(control[1]);  // the child exits on EOF
  (*child)->Wait();
  rusage self{}, children{};
  ::getrusage(RUSAGE_SELF, &self);
  ::getrusage(RUSAGE_CHILDREN, &children);
  std::printf(
      "Page faults (first touch of memory fresh from the kernel), whole "
      "run: sender %ld, receiver %ld.\n",
      self.ru_minflt, children.ru_minflt);
  return rc;
}
