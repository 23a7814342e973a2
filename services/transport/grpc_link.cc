#include "services/transport/grpc_link.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "services/transport/exchange_method.h"

namespace gpipe {
namespace {

using gpipe::v1::Frame;

class ClientFrameStream final : public FrameStream {
 public:
  ClientFrameStream(std::shared_ptr<grpc::Channel> channel,
                    std::unique_ptr<grpc::ClientContext> context,
                    std::unique_ptr<ExchangeClientStream> rw)
      : channel_(std::move(channel)),
        context_(std::move(context)),
        rw_(std::move(rw)) {}
  bool Read(grpc::ByteBuffer* b) override { return rw_->Read(b); }
  bool Write(const grpc::ByteBuffer& b) override { return rw_->Write(b); }
  void Cancel() override { context_->TryCancel(); }
  void WritesDone() { rw_->WritesDone(); }
  grpc::Status Finish() { return rw_->Finish(); }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<ExchangeClientStream> rw_;
};

// The upstream end: owns the reader thread, and on normal destruction
// half-closes and waits for the peer to finish, so no frame in flight is
// dropped.
class ClientLink final : public Link {
 public:
  ClientLink(ClientFrameStream* stream, std::unique_ptr<GrpcLink> link)
      : stream_(stream), link_(std::move(link)) {
    reader_ =
        std::thread([this] { link_->ReadLoop(/*cancel_on_reject=*/true); });
  }
  ~ClientLink() override {
    if (!aborted_) stream_->WritesDone();
    reader_.join();
    stream_->Finish();
    link_->Release();
  }
  absl::Status Send(Message m) override { return link_->Send(std::move(m)); }
  absl::StatusOr<Message> Receive() override { return link_->Receive(); }
  void Close() override {
    aborted_ = true;
    link_->Close();
  }
  int64_t bytes_sent() const override { return link_->bytes_sent(); }
  int64_t bytes_received() const override { return link_->bytes_received(); }

 private:
  ClientFrameStream* stream_;  // owned by link_
  std::unique_ptr<GrpcLink> link_;
  std::thread reader_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

GrpcLink::GrpcLink(std::unique_ptr<FrameStream> stream, std::string job_id,
                   int64_t epoch, size_t capacity, FrameCodec codec)
    : stream_(std::move(stream)),
      job_id_(std::move(job_id)),
      epoch_(epoch),
      codec_(codec),
      inbox_(capacity) {}

GrpcLink::~GrpcLink() = default;

absl::Status GrpcLink::Send(Message m) {
  std::lock_guard<std::mutex> lock(write_mu_);
  const int64_t bytes = m.tensor.defined() ? m.tensor.nbytes() : 0;
  const bool ok = WriteFrames(
      m, job_id_, epoch_, codec_,
      [this](const grpc::ByteBuffer& b) { return stream_->Write(b); });
  if (!ok) {
    absl::Status why = read_status();
    return why.ok() ? absl::UnavailableError(absl::StrCat(
                          "sending ", Describe(m), ": the peer went away"))
                    : why;
  }
  sent_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<Message> GrpcLink::Receive() {
  absl::StatusOr<Message> m = inbox_.Pop();
  if (m.ok() && m->tensor.defined()) received_ += m->tensor.nbytes();
  return m;
}

void GrpcLink::Close() {
  {
    // A link that rejected a frame keeps its stream, so the server's handler
    // can still answer the peer with the reason instead of a bare CANCELLED.
    // Once released, the server's handler may have returned and its call be
    // gone; holding mu_ keeps WaitReleased from returning while we cancel.
    std::lock_guard<std::mutex> lock(mu_);
    if (read_status_.ok() && !released_) stream_->Cancel();
  }
  inbox_.Close(absl::CancelledError("link closed"));
}

void GrpcLink::ReadLoop(bool cancel_on_reject) {
  FrameAssembler assembler(job_id_, epoch_);
  grpc::ByteBuffer buffer;
  ReceivedFrame frame;
  absl::Status status;
  while (stream_->Read(&buffer)) {
    const absl::Status decoded = codec_ == FrameCodec::kZeroCopy
                                     ? DecodeFrame(buffer, &frame)
                                     : DecodeFrameCopying(buffer, &frame);
    absl::StatusOr<std::optional<Message>> m =
        decoded.ok() ? assembler.Add(frame)
                     : absl::StatusOr<std::optional<Message>>(decoded);
    if (!m.ok()) {
      status = m.status();
      if (cancel_on_reject) stream_->Cancel();
      break;
    }
    if (!m->has_value()) continue;
    if (absl::Status pushed = inbox_.Push(std::move(**m)); !pushed.ok()) {
      break;  // closed locally
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    read_status_ = status;
  }
  inbox_.Close(status.ok() ? absl::UnavailableError(
                                 "the neighbouring stage closed the link")
                           : status);
}

absl::Status GrpcLink::read_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return read_status_;
}

void GrpcLink::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  released_ = true;
  released_cv_.notify_all();
}

void GrpcLink::WaitReleased() {
  std::unique_lock<std::mutex> lock(mu_);
  released_cv_.wait(lock, [&] { return released_; });
}

grpc::ChannelArguments KeepaliveChannelArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(4 * kMaxChunkBytes);
  return args;
}

absl::StatusOr<std::unique_ptr<Link>> ConnectDownstream(
    const std::string& address, const std::string& job_id, int64_t epoch,
    int64_t from_stage, size_t capacity, int64_t deadline_ms, FrameCodec codec,
    const ExchangeCredentials& credentials) {
  grpc::ChannelArguments args = KeepaliveChannelArguments();
  if (credentials.channel != nullptr && !credentials.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(credentials.tls_server_name);
  }
  auto channel = grpc::CreateCustomChannel(
      address,
      credentials.channel != nullptr ? credentials.channel
                                     : grpc::InsecureChannelCredentials(),
      args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 std::chrono::milliseconds(deadline_ms))) {
    // With TLS a refused handshake looks the same as a peer that is down.
    const std::string tls_hint =
        credentials.channel == nullptr
            ? std::string()
            : absl::StrCat(
                  " (TLS: is its certificate signed by our --tls_ca and "
                  "issued for ",
                  credentials.tls_server_name.empty()
                      ? std::string("its host")
                      : absl::StrCat("\"", credentials.tls_server_name,
                                     "\" (--tls_peer_name)"),
                  "?)");
    return absl::UnavailableError(
        absl::StrCat("cannot reach the next stage at ", address, " within ",
                     deadline_ms, " ms", tls_hint));
  }
  auto context = std::make_unique<grpc::ClientContext>();
  if (!credentials.stream_key.empty()) {
    context->AddMetadata(kStreamKeyMetadata, credentials.stream_key);
  }
  std::unique_ptr<ExchangeClientStream> rw =
      StartExchange(channel.get(), context.get());
  Frame open;
  open.set_job_id(job_id);
  open.set_epoch(epoch);
  open.set_kind(gpipe::v1::OPEN);
  open.set_from_stage(from_stage);
  if (!rw->Write(FrameToBuffer(open))) {
    grpc::Status s = rw->Finish();
    return absl::UnavailableError(
        absl::StrCat("the next stage at ", address,
                     " refused the link: ", s.error_message()));
  }
  auto stream = std::make_unique<ClientFrameStream>(
      std::move(channel), std::move(context), std::move(rw));
  ClientFrameStream* raw = stream.get();
  auto link = std::make_unique<GrpcLink>(std::move(stream), job_id, epoch,
                                         capacity, codec);
  return std::unique_ptr<Link>(new ClientLink(raw, std::move(link)));
}

}  // namespace gpipe
