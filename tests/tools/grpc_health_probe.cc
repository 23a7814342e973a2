// grpc_health_probe: asks a server's standard health service
// (grpc.health.v1.Health/Check) for one service name and prints the answer,
// as a Kubernetes gRPC probe would. Exit status 0 when SERVING, 1 when the
// answer is anything else, 2 when the call fails.
//   grpc_health_probe HOST:PORT [SERVICE] [--timeout_ms N]
// The two health messages are one string field and one enum field, so they
// are encoded here by hand rather than generated from a .proto that Debian
// does not ship.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"

namespace {

const char* StatusName(int status) {
  switch (status) {
    case 0:
      return "UNKNOWN";
    case 1:
      return "SERVING";
    case 2:
      return "NOT_SERVING";
    case 3:
      return "SERVICE_UNKNOWN";
  }
  return "INVALID";
}

// HealthCheckRequest { string service = 1; }
std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;
  out.push_back(0x0a);
  size_t n = service.size();
  while (n >= 0x80) {
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
    n >>= 7;
  }
  out.push_back(static_cast<char>(n));
  return out + service;
}

// HealthCheckResponse { ServingStatus status = 1; }; -1 when malformed.
int DecodeStatus(const std::string& bytes) {
  if (bytes.empty()) return 0;  // the default value is not on the wire
  if (bytes.size() < 2 || bytes[0] != 0x08) return -1;
  return static_cast<unsigned char>(bytes[1]) & 0x7f;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional;
  int timeout_ms = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--timeout_ms" && i + 1 < argc) {
      timeout_ms = std::atoi(argv[++i]);
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.empty() || positional.size() > 2 || timeout_ms <= 0) {
    std::fprintf(stderr,
                 "usage: grpc_health_probe HOST:PORT [SERVICE] "
                 "[--timeout_ms N]\n");
    return 2;
  }
  const std::string service = positional.size() == 2 ? positional[1] : "";
  auto channel =
      grpc::CreateChannel(positional[0], grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(timeout_ms));
  const std::string request_bytes = EncodeRequest(service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status status = done.get_future().get();
  if (!status.ok()) {
    std::printf("%s service \"%s\": error %d: %s\n", positional[0].c_str(),
                service.c_str(), status.error_code(),
                status.error_message().c_str());
    return 2;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (response.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  const int serving = DecodeStatus(bytes);
  std::printf("%s service \"%s\": %s\n", positional[0].c_str(), service.c_str(),
              StatusName(serving));
  return serving == 1 ? 0 : 1;
}
