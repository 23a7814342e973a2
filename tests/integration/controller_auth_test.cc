// The controller's bearer tokens over real gRPC on loopback: every job API
// method wants a job API token, Attach wants a worker token (and not the
// other kind), each refusal is UNAUTHENTICATED with a message saying what
// is missing; the plaintext health port answers while the API wants tokens.
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "controller/controller_server.h"
#include "gmock/gmock.h"
#include "gpipe/v1/controller.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "services/security/bearer_token.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;
using ::testing::HasSubstr;

constexpr char kApiToken[] = "api-token-0123456789abcdef";
constexpr char kOtherApiToken[] = "api-token-rotated-0123456789";
constexpr char kWorkerToken[] = "worker-token-0123456789abcdef";

class ControllerAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gpipe-auth-test-XXXXXX";
    dir_ = mkdtemp(pattern);
    ControllerServerOptions options;
    options.listen = "127.0.0.1:0";
    options.controller.checkpoint_dir = dir_ + "/checkpoints";
    options.auth.api = security::TokenVerifier({kApiToken, kOtherApiToken});
    options.auth.workers = security::TokenVerifier({kWorkerToken});
    options.health_listen = "127.0.0.1:0";
    auto server = ControllerServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = v1::Controller::NewStub(grpc::CreateChannel(
        server_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    stub_.reset();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // A context with a deadline and, unless empty, the token.
  static void Prepare(grpc::ClientContext* context, const std::string& token) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(10));
    security::AttachBearerToken(context, token, /*secure_channel=*/false);
  }

  grpc::Status ListJobs(const std::string& token) {
    grpc::ClientContext context;
    Prepare(&context, token);
    v1::ListJobsResponse response;
    return stub_->ListJobs(&context, v1::ListJobsRequest(), &response);
  }

  // Opens Attach with `token` and says hello: the status the stream ends
  // with, or OK once the controller's Welcome arrives.
  grpc::Status Attach(const std::string& token) {
    grpc::ClientContext context;
    Prepare(&context, token);
    auto stream = stub_->Attach(&context);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id("w-auth");
    hello.mutable_hello()->set_address("127.0.0.1:9");
    stream->Write(hello);
    v1::ControllerMessage reply;
    if (stream->Read(&reply) && reply.has_welcome()) {
      context.TryCancel();
      stream->Finish();
      return grpc::Status::OK;
    }
    return stream->Finish();
  }

  std::string dir_;
  std::unique_ptr<ControllerServer> server_;
  std::unique_ptr<v1::Controller::Stub> stub_;
};

TEST_F(ControllerAuthTest, JobApiWantsAJobApiToken) {
  grpc::Status missing = ListJobs("");
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("missing bearer token"));

  grpc::Status wrong = ListJobs("api-token-0123456789abcdeX");
  EXPECT_EQ(wrong.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong.error_message(), "invalid bearer token for the job API");

  // The worker token is not a job API token.
  EXPECT_EQ(ListJobs(kWorkerToken).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(ListJobs(kApiToken).ok());
  EXPECT_TRUE(ListJobs(kOtherApiToken).ok());
}

TEST_F(ControllerAuthTest, EveryJobApiMethodChecksTheToken) {
  {
    grpc::ClientContext context;
    Prepare(&context, "");
    v1::SubmitJobRequest request;
    v1::Job job;
    EXPECT_EQ(stub_->SubmitJob(&context, request, &job).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    Prepare(&context, "");
    v1::GetJobRequest request;
    request.set_job_id("job-00000000");
    v1::Job job;
    EXPECT_EQ(stub_->GetJob(&context, request, &job).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    // With the token the same call reaches the controller: NOT_FOUND.
    grpc::ClientContext context;
    Prepare(&context, kApiToken);
    v1::GetJobRequest request;
    request.set_job_id("job-00000000");
    v1::Job job;
    EXPECT_EQ(stub_->GetJob(&context, request, &job).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext context;
    Prepare(&context, "");
    v1::CancelJobRequest request;
    request.set_job_id("job-00000000");
    v1::Job job;
    EXPECT_EQ(stub_->CancelJob(&context, request, &job).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    Prepare(&context, "");
    v1::ListWorkersResponse response;
    EXPECT_EQ(stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    Prepare(&context, "");
    v1::GetTraceRequest request;
    request.set_job_id("job-00000000");
    v1::GetTraceResponse response;
    EXPECT_EQ(stub_->GetTrace(&context, request, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    Prepare(&context, kWorkerToken);
    v1::WatchJobRequest request;
    request.set_job_id("job-00000000");
    auto reader = stub_->WatchJob(&context, request);
    v1::JobEvent event;
    EXPECT_FALSE(reader->Read(&event));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  for (const std::string& token : {std::string(), std::string(kWorkerToken)}) {
    // A model is the job's result: the job API token, not a worker's.
    grpc::ClientContext context;
    Prepare(&context, token);
    v1::FetchModelRequest request;
    request.set_job_id("job-00000000");
    auto reader = stub_->FetchModel(&context, request);
    v1::FetchModelResponse response;
    EXPECT_FALSE(reader->Read(&response));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    Prepare(&context, kApiToken);
    v1::FetchModelRequest request;
    request.set_job_id("job-00000000");
    auto reader = stub_->FetchModel(&context, request);
    v1::FetchModelResponse response;
    EXPECT_FALSE(reader->Read(&response));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(ControllerAuthTest, AttachWantsTheWorkerToken) {
  grpc::Status missing = Attach("");
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(missing.error_message(), HasSubstr("missing bearer token"));
  grpc::Status api = Attach(kApiToken);
  EXPECT_EQ(api.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(api.error_message(), "invalid bearer token for attaching a worker");
  EXPECT_TRUE(Attach(kWorkerToken).ok());
}

TEST_F(ControllerAuthTest, HealthPortAnswersWithoutAToken) {
  ASSERT_GT(server_->health_port(), 0);
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->health_port()),
                          grpc::InsecureChannelCredentials());
  // grpc.health.v1.Health/Check with service "" (an empty request).
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::ByteBuffer request, response;
  {
    grpc::Slice empty;
    request = grpc::ByteBuffer(&empty, 1);
  }
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check",
                    grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      std::lock_guard<std::mutex> lock(mu);
                      status = s;
                      done = true;
                      cv.notify_all();
                    });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // HealthCheckResponse{status: SERVING (1)}.
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

}  // namespace
}  // namespace gpipe::controller
