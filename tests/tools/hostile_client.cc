// hostile_client: plays someone who can reach the controller's port and
// means harm, for tests/scripts/hostile_client_test.sh. Each command prints
// what the controller did ("CODE: message", or what it sent) and exits 0
// when the controller held (refused, or gave nothing away), 1 when it did
// not, 2 on bad usage.
//   hostile_client forge-hello CONTROLLER WORKER_ID
//       Attaches saying hello under WORKER_ID (a live worker's id) with a
//       session key of its own: held when refused.
//   hostile_client stall CONTROLLER SECONDS
//       Attaches as a new worker, takes the first assignment it is given
//       and then only sends heartbeats; prints each assignment and cancel.
//       Held when it was cancelled (the controller gave up on it) and was
//       given no second assignment.
//   hostile_client raw CONTROLLER METHOD TEXT
//       Sends TEXT as the request bytes of the unary METHOD (e.g.
//       /gpipe.v1.Controller/SubmitJob): held when refused with
//       INVALID_ARGUMENT.
// Options, anywhere after the command: --worker_id ID and --session_key K
// (forge-hello: the key to present; stall: who to attach as), and
// --tls_ca F --tls_cert F --tls_key F --token_file F to reach a secured
// controller (the token goes with Attach).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gpipe/v1/controller.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "services/security/client_security.h"
#include "services/security/token_file.h"

namespace {

namespace v1 = gpipe::v1;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string worker_id;
  std::string session_key;
  gpipe::security::ClientSecurity security;
};
Options options;

std::shared_ptr<grpc::Channel> Dial(const std::string& target) {
  grpc::ChannelArguments args;
  options.security.ApplyTo(args);
  return grpc::CreateCustomChannel(target, options.security.Credentials(),
                                   args);
}

void Prepare(grpc::ClientContext* context, int seconds) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(seconds));
  options.security.ApplyTo(context);
}

std::string Describe(const grpc::Status& s) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int code = static_cast<int>(s.error_code());
  return std::string(code >= 0 && code <= 16 ? kNames[code] : "?") + ": " +
         s.error_message();
}

int ForgeHello(const std::string& controller, const std::string& id) {
  auto stub = v1::Controller::NewStub(Dial(controller));
  grpc::ClientContext context;
  Prepare(&context, 10);
  auto stream = stub->Attach(&context);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(id);
  hello.mutable_hello()->set_address("127.0.0.1:1");
  hello.mutable_hello()->set_session_key(options.session_key.empty()
                                             ? "not-the-workers-key"
                                             : options.session_key);
  stream->Write(hello);
  v1::ControllerMessage reply;
  const bool welcomed = stream->Read(&reply) && reply.has_welcome();
  if (welcomed) {
    std::printf("WELCOMED as %s\n", id.c_str());
    context.TryCancel();
    stream->Finish();
    return 1;
  }
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  std::printf("%s\n", Describe(status).c_str());
  return status.error_code() == grpc::StatusCode::ALREADY_EXISTS ? 0 : 1;
}

int Stall(const std::string& controller, int seconds) {
  auto stub = v1::Controller::NewStub(Dial(controller));
  grpc::ClientContext context;
  Prepare(&context, seconds + 10);
  auto stream = stub->Attach(&context);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(
      options.worker_id.empty() ? "hostile-staller" : options.worker_id);
  hello.mutable_hello()->set_address("127.0.0.1:1");
  hello.mutable_hello()->set_session_key(
      options.session_key.empty() ? "staller-key" : options.session_key);
  hello.mutable_hello()->mutable_resources()->set_cpus(64);
  stream->Write(hello);
  std::atomic<bool> done{false};
  std::thread beats([&] {
    while (!done.load()) {
      v1::WorkerMessage beat;
      beat.mutable_heartbeat();
      if (!stream->Write(beat)) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  int assignments = 0, cancels = 0;
  std::thread stop([&] {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    done.store(true);
    context.TryCancel();
  });
  v1::ControllerMessage m;
  while (stream->Read(&m)) {
    if (m.has_assignment()) {
      ++assignments;
      std::printf("assigned stage %lld of %s (epoch %lld)\n",
                  static_cast<long long>(m.assignment().stage()),
                  m.assignment().job_id().c_str(),
                  static_cast<long long>(m.assignment().epoch()));
    } else if (m.has_cancel()) {
      ++cancels;
      std::printf("cancelled: %s epoch %lld\n", m.cancel().job_id().c_str(),
                  static_cast<long long>(m.cancel().epoch()));
    }
    std::fflush(stdout);
  }
  done.store(true);
  stop.join();
  beats.join();
  stream->Finish();
  std::printf("%d assignment(s), %d cancel(s)\n", assignments, cancels);
  return assignments == 1 && cancels >= 1 ? 0 : 1;
}

int Raw(const std::string& controller, const std::string& method,
        const std::string& text) {
  grpc::GenericStub generic(Dial(controller));
  grpc::ClientContext context;
  Prepare(&context, 10);
  grpc::CompletionQueue cq;
  grpc::Slice slice(text.data(), text.size());
  grpc::ByteBuffer request(&slice, 1);
  auto call = generic.PrepareUnaryCall(&context, method, request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  std::printf("%s\n", Describe(status).c_str());
  return status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args;
  gpipe::security::TlsFlags tls;
  std::string token_file;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::string* value = a == "--worker_id"     ? &options.worker_id
                         : a == "--session_key" ? &options.session_key
                         : a == "--tls_ca"      ? &tls.ca
                         : a == "--tls_cert"    ? &tls.cert
                         : a == "--tls_key"     ? &tls.key
                         : a == "--token_file"  ? &token_file
                                                : nullptr;
    if (value == nullptr) {
      args.push_back(a);
    } else if (i + 1 < argc) {
      *value = argv[++i];
    } else {
      std::fprintf(stderr, "hostile_client: %s needs a value\n", a.c_str());
      return 2;
    }
  }
  auto material = gpipe::security::LoadClientTls(tls);
  if (!material.ok()) {
    std::fprintf(stderr, "hostile_client: %s\n",
                 std::string(material.status().message()).c_str());
    return 2;
  }
  options.security.tls = *material;
  if (!token_file.empty()) {
    auto tokens = gpipe::security::ReadTokenFile("token_file", token_file);
    if (!tokens.ok() || tokens->empty()) {
      std::fprintf(stderr, "hostile_client: no token in %s\n",
                   token_file.c_str());
      return 2;
    }
    options.security.token = tokens->front();
  }
  const std::string command = !args.empty() ? args[0] : "";
  if (command == "forge-hello" && args.size() == 3)
    return ForgeHello(args[1], args[2]);
  if (command == "stall" && args.size() == 3)
    return Stall(args[1], std::atoi(args[2].c_str()));
  if (command == "raw" && args.size() == 4)
    return Raw(args[1], args[2], args[3]);
  std::fprintf(stderr,
               "usage: hostile_client forge-hello CONTROLLER WORKER_ID\n"
               "       hostile_client stall CONTROLLER SECONDS\n"
               "       hostile_client raw CONTROLLER METHOD TEXT\n");
  return 2;
}
