// rogue_exchange: plays a stranger who can reach a worker's Stage port and
// tries to push tensors into a job: opens Exchange as stage FROM of JOB in
// EPOCH, with no stream key or a made-up one, writes a few activation
// frames and prints how the worker answered ("CODE: message"). Exit status
// 0 when the worker refused the stream, 1 when it took the frames, 2 on bad
// usage or credentials.
//   rogue_exchange HOST:PORT JOB EPOCH FROM [--stream_key K]
//                  [--tls_ca F --tls_cert F --tls_key F] [--tls_server_name N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "services/security/client_security.h"
#include "services/transport/exchange_link.h"
#include "services/transport/exchange_method.h"
#include "services/transport/frame_wire.h"

namespace {

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "OK";
    case grpc::StatusCode::CANCELLED:
      return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    case grpc::StatusCode::UNAVAILABLE:
      return "UNAVAILABLE";
    default:
      return "OTHER";
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  std::string key, ca, cert, tls_key, server_name;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    bool ok = true;
    if (a == "--stream_key") {
      ok = value(&key);
    } else if (a == "--tls_ca") {
      ok = value(&ca);
    } else if (a == "--tls_cert") {
      ok = value(&cert);
    } else if (a == "--tls_key") {
      ok = value(&tls_key);
    } else if (a == "--tls_server_name") {
      ok = value(&server_name);
    } else {
      positional.push_back(a);
    }
    if (!ok) {
      std::fprintf(stderr, "rogue_exchange: %s needs a value\n", a.c_str());
      return 2;
    }
  }
  if (positional.size() != 4) {
    std::fprintf(stderr,
                 "usage: rogue_exchange HOST:PORT JOB EPOCH FROM "
                 "[--stream_key K] [--tls_ca F --tls_cert F --tls_key F] "
                 "[--tls_server_name N]\n");
    return 2;
  }
  gpipe::security::ClientSecurity security;
  auto tls = gpipe::security::LoadClientTls({cert, tls_key, ca});
  if (!tls.ok()) {
    std::fprintf(stderr, "rogue_exchange: %s\n",
                 std::string(tls.status().message()).c_str());
    return 2;
  }
  security.tls = *tls;
  security.tls_server_name = server_name;
  grpc::ChannelArguments args;
  security.ApplyTo(args);
  auto channel =
      grpc::CreateCustomChannel(positional[0], security.Credentials(), args);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(20));
  if (!key.empty()) context.AddMetadata(gpipe::kStreamKeyMetadata, key);
  auto stream = gpipe::StartExchange(channel.get(), &context);

  gpipe::v1::Frame frame;
  frame.set_job_id(positional[1]);
  frame.set_epoch(std::atoll(positional[2].c_str()));
  frame.set_from_stage(std::atoll(positional[3].c_str()));
  frame.set_kind(gpipe::v1::OPEN);
  int written = stream->Write(gpipe::FrameToBuffer(frame)) ? 1 : 0;
  // What a stranger would push: activations of step 0 that are not the
  // job's (a header-less frame would be refused for its shape alone).
  frame.set_kind(gpipe::v1::ACTIVATION);
  frame.set_step(0);
  frame.set_payload(std::string(64, '\x7f'));
  frame.set_last(true);
  for (int i = 0; i < 4 && written > 0; ++i) {
    frame.set_micro_batch(i);
    if (stream->Write(gpipe::FrameToBuffer(frame))) ++written;
  }
  stream->WritesDone();
  grpc::ByteBuffer reply;
  while (stream->Read(&reply)) {
  }
  const grpc::Status status = stream->Finish();
  std::printf("%s: %s (%d frames written)\n", CodeName(status.error_code()),
              status.error_message().c_str(), written);
  return status.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                 status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
                 status.error_code() == grpc::StatusCode::UNAVAILABLE
             ? 0
             : 1;
}
