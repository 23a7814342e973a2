// The controller over real gRPC on loopback: jobs submitted and watched
// through the Controller API, fake workers driven by the test through real
// Attach streams (hello, heartbeats, progress, finished, failed).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "controller/controller_server.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gpipe/v1/controller.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/pipeline/model_file.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors.h"
#include "services/storage/sha256.h"
#include "services/tensor/tensor.h"
#include "services/transport/exchange_link.h"
#include "tests/support/controller_fixtures.h"
#include "tests/support/fake_worker.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;
using ::testing::HasSubstr;

using test_support::Checkpointed;
using test_support::FakeWorker;
using test_support::RecoverableSpec;
constexpr int64_t kLayers = test_support::kControllerSpecLayers;
constexpr absl::Duration kWait = absl::Seconds(5);

v1::JobSpec Spec() { return test_support::ControllerSpec(2); }
v1::JobSpec SpecWithStages(int64_t stages) {
  return test_support::ControllerSpec(stages);
}

// Collects a WatchJob stream on a thread until it ends.
class Watcher {
 public:
  Watcher(v1::Controller::Stub &stub, const std::string &job_id) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(30));
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    thread_ = std::thread([this, &stub, request] {
      auto reader = stub.WatchJob(&context_, request);
      v1::JobEvent event;
      while (reader->Read(&event)) {
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(event);
        cv_.notify_all();
      }
      grpc::Status status = reader->Finish();
      std::lock_guard<std::mutex> lock(mu_);
      status_ = status;
      cv_.notify_all();
    });
  }
  ~Watcher() {
    context_.TryCancel();
    thread_.join();
  }

  // The stream's status once it ended (DEADLINE_EXCEEDED if it did not).
  grpc::Status Wait(absl::Duration timeout = kWait) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                      [&] { return status_.has_value(); })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "still open");
    }
    return *status_;
  }
  // Waits until at least `n` events arrived; whether they did.
  bool WaitForEvents(size_t n, absl::Duration timeout = kWait) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                        [&] { return events_.size() >= n; });
  }
  std::vector<v1::JobState> States() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<v1::JobState> states;
    for (const v1::JobEvent &e : events_) {
      const v1::JobState s = e.job().status().state();
      if (states.empty() || states.back() != s) states.push_back(s);
    }
    return states;
  }

 private:
  grpc::ClientContext context_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::JobEvent> events_;
  std::optional<grpc::Status> status_;
};

class ControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("controller_test-", getpid(), "-", info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  void TearDown() override {
    stub_.reset();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void StartController(absl::Duration heartbeat_timeout = absl::Seconds(10)) {
    ControllerServerOptions options;
    options.listen = "127.0.0.1:0";
    options.controller.checkpoint_dir = (dir_ / "checkpoints").string();
    // The fake workers write their files where shared-path stages do
    // (controller_stage_files_test covers the files through the API).
    options.controller.checkpoint_transport =
        v1::CHECKPOINT_TRANSPORT_SHARED_PATH;
    options.controller.heartbeat_timeout = heartbeat_timeout;
    options.controller.heartbeat_interval = absl::Milliseconds(100);
    options.controller.store_path = store_path_;
    auto server = ControllerServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    auto channel = grpc::CreateChannel(server_->address(),
                                       grpc::InsecureChannelCredentials());
    stub_ = v1::Controller::NewStub(channel);
  }

  std::unique_ptr<FakeWorker> AttachWorker(int n) {
    auto worker = std::make_unique<FakeWorker>(
        *stub_, absl::StrCat("w", n), absl::StrCat("127.0.0.1:", 9000 + n));
    worker->Attach();
    return worker;
  }

  grpc::Status Submit(const v1::JobSpec &spec, v1::Job *job) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    return stub_->SubmitJob(&context, request, job);
  }

  v1::Job SubmitOk(const v1::JobSpec &spec) {
    v1::Job job;
    const grpc::Status status = Submit(spec, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job;
  }

  grpc::Status Get(const std::string &id, v1::Job *job) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::GetJobRequest request;
    request.set_job_id(id);
    return stub_->GetJob(&context, request, job);
  }

  grpc::Status Cancel(const std::string &id, v1::Job *job) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::CancelJobRequest request;
    request.set_job_id(id);
    return stub_->CancelJob(&context, request, job);
  }

  std::vector<v1::WorkerInfo> Workers() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::ListWorkersResponse response;
    const grpc::Status status =
        stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.workers().begin(), response.workers().end()};
  }

  // Polls GetJob until `done` holds (or fails the test after `timeout`).
  v1::Job WaitForJob(const std::string &id,
                     const std::function<bool(const v1::Job &)> &done,
                     absl::Duration timeout = kWait) {
    const absl::Time deadline = absl::Now() + timeout;
    v1::Job job;
    while (true) {
      const grpc::Status status = Get(id, &job);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok() || done(job)) return job;
      if (absl::Now() > deadline) {
        ADD_FAILURE() << "timed out waiting for " << id << ": "
                      << job.status().DebugString();
        return job;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  v1::Job WaitForState(const std::string &id, v1::JobState state) {
    return WaitForJob(id, [state](const v1::Job &job) {
      return job.status().state() == state;
    });
  }

  // Where the assignment's stage writes its final parameters (the only path
  // the controller accepts in its StageFinished).
  static std::string FinalPath(const v1::Assignment &a) {
    return absl::StrCat(a.output_dir(), "/e", a.epoch(), "-stage-", a.stage(),
                        ".safetensors");
  }

  // Writes a stage's parameters as a worker would: one small tensor per
  // layer of its range, filled with the layer index.
  std::string WriteStageParameters(const v1::Assignment &a) {
    std::vector<Tensor> tensors;
    std::vector<std::string> names;
    for (int64_t layer = a.layer_begin(); layer < a.layer_end(); ++layer) {
      names.push_back(absl::StrCat("layers.", layer, ".weight"));
      tensors.push_back(Tensor::Filled({2, 3}, static_cast<float>(layer)));
    }
    std::vector<std::pair<std::string, const Tensor *>> list;
    for (size_t i = 0; i < tensors.size(); ++i) {
      list.emplace_back(names[i], &tensors[i]);
    }
    std::filesystem::create_directories(a.output_dir());
    const std::string path = FinalPath(a);
    const absl::Status written = WriteSafetensors(path, list);
    EXPECT_TRUE(written.ok()) << written;
    return path;
  }

  // Writes stage a's checkpoint file for `step` where the controller expects
  // it and returns the report a worker sends.
  std::string store_path_;  // StartController uses it when set
  std::filesystem::path dir_;
  std::unique_ptr<ControllerServer> server_;
  std::unique_ptr<v1::Controller::Stub> stub_;
};

const v1::Condition *Condition(const v1::Job &job, std::string_view type) {
  for (const v1::Condition &c : job.status().conditions()) {
    if (c.type() == type) return &c;
  }
  return nullptr;
}

v1::WorkerMessage Finished(const v1::Assignment &a, const std::string &path) {
  v1::WorkerMessage m;
  v1::StageFinished &f = *m.mutable_finished();
  f.set_job_id(a.job_id());
  f.set_epoch(a.epoch());
  f.set_stage(a.stage());
  f.set_parameters_path(path);
  return m;
}

std::string ToString(const grpc::ByteBuffer &buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice &s : slices) {
    out.append(reinterpret_cast<const char *>(s.begin()), s.size());
  }
  return out;
}

grpc::ByteBuffer ToBuffer(const std::string &bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// A request that is not its method's protobuf message is INVALID_ARGUMENT
// naming the method (gRPC alone says INTERNAL with no message), on unary
// and server-streaming methods alike; the controller keeps serving.
TEST_F(ControllerTest, UnparsableRequestsAreInvalidArgument) {
  StartController();
  auto channel = grpc::CreateChannel(server_->address(),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  // Field 1 as a varint that never ends: no protobuf parser accepts it.
  const grpc::ByteBuffer garbage = ToBuffer(std::string("\x0a\xff\xff", 3));
  for (const char *method :
       {"/gpipe.v1.Controller/GetJob", "/gpipe.v1.Controller/SubmitJob",
        "/gpipe.v1.Controller/WatchJob"}) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&context, method, grpc::StubOptions(), &garbage,
                      &response, [&](grpc::Status s) { done.set_value(s); });
    const grpc::Status s = done.get_future().get();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(method));
  }
  v1::Job job;
  EXPECT_EQ(Get("job-00000000", &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// The standard health service answers SERVING and server reflection lists
// the Controller service (both checked on the wire, without their stubs).
TEST_F(ControllerTest, ServesHealthAndReflection) {
  StartController();
  auto channel = grpc::CreateChannel(server_->address(),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);

  grpc::ClientContext health_context;
  health_context.set_deadline(std::chrono::system_clock::now() +
                              std::chrono::seconds(5));
  const grpc::ByteBuffer health_request = ToBuffer("");  // service ""
  grpc::ByteBuffer health_response;
  std::promise<grpc::Status> health_done;
  generic.UnaryCall(&health_context, "/grpc.health.v1.Health/Check",
                    grpc::StubOptions(), &health_request, &health_response,
                    [&](grpc::Status s) { health_done.set_value(s); });
  const grpc::Status health = health_done.get_future().get();
  ASSERT_TRUE(health.ok()) << health.error_message();
  EXPECT_EQ(ToString(health_response), std::string("\x08\x01"));  // SERVING

  // ServerReflectionRequest{list_services: "*"} on the bidi stream.
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  auto call = generic.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  auto step = [&cq](int tag) {
    void *got = nullptr;
    bool ok = false;
    const auto deadline =
        std::chrono::system_clock::now() + std::chrono::seconds(5);
    return cq.AsyncNext(&got, &ok, deadline) ==
               grpc::CompletionQueue::GOT_EVENT &&
           got == reinterpret_cast<void *>(static_cast<intptr_t>(tag)) && ok;
  };
  auto tag = [](int t) {
    return reinterpret_cast<void *>(static_cast<intptr_t>(t));
  };
  call->StartCall(tag(1));
  ASSERT_TRUE(step(1));
  call->Write(ToBuffer(std::string("\x3a\x01*", 3)), tag(2));
  ASSERT_TRUE(step(2));
  grpc::ByteBuffer reply;
  call->Read(&reply, tag(3));
  ASSERT_TRUE(step(3));
  EXPECT_THAT(ToString(reply), HasSubstr("gpipe.v1.Controller"));
  call->WritesDone(tag(4));
  ASSERT_TRUE(step(4));
  grpc::Status status;
  call->Finish(&status, tag(5));
  ASSERT_TRUE(step(5));
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void *ignored;
  bool ok;
  while (cq.Next(&ignored, &ok)) {
  }
}

TEST_F(ControllerTest, MalformedSpecIsInvalidArgumentNamingTheField) {
  StartController();
  struct Case {
    std::string name;
    std::function<void(v1::JobSpec &)> edit;
    std::string field;
  };
  const std::vector<Case> cases = {
      {"LayerShape",
       [](v1::JobSpec &s) {
         s.mutable_model()
             ->mutable_layers(2)
             ->mutable_linear()
             ->set_in_features(31);
       },
       "model.layers[2].linear.in_features"},
      {"NoSteps", [](v1::JobSpec &s) { s.set_steps(0); }, "steps"},
      {"NegativeBatch", [](v1::JobSpec &s) { s.set_batch_size(-4); },
       "batch_size"},
      {"TooManyStages",
       [](v1::JobSpec &s) { s.mutable_pipeline()->set_stages(9); },
       "pipeline.stages"},
      // Sizes no worker could hold: rejected here, not an OOM later.
      {"LayerOfABillionUnits",
       [](v1::JobSpec &s) {
         s.mutable_model()
             ->mutable_layers(0)
             ->mutable_linear()
             ->set_out_features(1'000'000'000);
         s.mutable_model()
             ->mutable_layers(2)
             ->mutable_linear()
             ->set_in_features(1'000'000'000);
       },
       "model.layers[0].linear"},
      {"BatchOfATrillion",
       [](v1::JobSpec &s) { s.set_batch_size(1'000'000'000'000); },
       "batch_size"},
      {"EvalBatchOfATrillion",
       [](v1::JobSpec &s) {
         s.mutable_eval()->set_batch_size(1'000'000'000'000);
       },
       "eval.batch_size"},
      {"NegativeEvalEvery",
       [](v1::JobSpec &s) { s.mutable_eval()->set_every(-1); }, "eval.every"},
  };
  for (const Case &c : cases) {
    v1::JobSpec spec = Spec();
    c.edit(spec);
    v1::Job job;
    const grpc::Status status = Submit(spec, &job);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name;
    EXPECT_THAT(status.error_message(), HasSubstr(c.field + ":")) << c.name;
  }
  grpc::ClientContext context;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(stub_->ListJobs(&context, v1::ListJobsRequest(), &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0);
}

TEST_F(ControllerTest, UnknownJobIsNotFound) {
  StartController();
  v1::Job job;
  grpc::Status status = Get("job-00000000", &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "job job-00000000 not found");
  status = Cancel("job-00000000", &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "job job-00000000 not found");
  Watcher watcher(*stub_, "job-00000000");
  status = watcher.Wait();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "job job-00000000 not found");
}

TEST_F(ControllerTest, TwoStageJobRunsToSuccess) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  const v1::Job submitted = SubmitOk(SpecWithStages(2));
  ASSERT_THAT(submitted.id(), ::testing::MatchesRegex("job-[0-9a-f]{8}"));
  EXPECT_EQ(submitted.status().state(), v1::PENDING);
  EXPECT_EQ(submitted.status().total_steps(), 10);
  const v1::Condition *scheduled = Condition(submitted, "Scheduled");
  ASSERT_NE(scheduled, nullptr);
  EXPECT_FALSE(scheduled->status());
  EXPECT_EQ(scheduled->reason(), "WaitingForWorkers");
  EXPECT_EQ(scheduled->message(),
            "needs 2 workers, 1 free (only 1 is attached: it waits for more "
            "to join; jobs behind it that fit go first)");
  const std::string id = submitted.id();

  Watcher watcher(*stub_, id);
  ASSERT_TRUE(watcher.WaitForEvents(1));
  // One worker is not enough.
  EXPECT_FALSE(w1->Next(absl::Milliseconds(200)).has_value());
  v1::Job job;
  ASSERT_TRUE(Get(id, &job).ok());
  EXPECT_EQ(job.status().state(), v1::PENDING);

  std::unique_ptr<FakeWorker> w2 = AttachWorker(2);
  const v1::Assignment a0 = w1->NextAssignment();
  const v1::Assignment a1 = w2->NextAssignment();
  const std::string output_dir = (dir_ / "checkpoints" / id / "final").string();
  for (const v1::Assignment *a : {&a0, &a1}) {
    EXPECT_EQ(a->job_id(), id);
    EXPECT_EQ(a->epoch(), 1);
    EXPECT_EQ(a->stages(), 2);
    EXPECT_EQ(a->micro_batches(), 4);
    EXPECT_EQ(a->schedule(), v1::GPIPE);
    EXPECT_EQ(a->remat(), v1::EXCEPT_LAST);
    EXPECT_EQ(a->start_step(), 0);
    EXPECT_EQ(a->output_dir(), output_dir);
    EXPECT_EQ(a->spec().SerializeAsString(),
              SpecWithStages(2).SerializeAsString());
  }
  EXPECT_EQ(a0.stage(), 0);
  EXPECT_EQ(a1.stage(), 1);
  EXPECT_EQ(a0.upstream_address(), "");
  EXPECT_EQ(a0.downstream_address(), w2->address());
  EXPECT_EQ(a1.upstream_address(), w1->address());
  EXPECT_EQ(a1.downstream_address(), "");
  // Contiguous ranges that cover every layer, none empty.
  EXPECT_EQ(a0.layer_begin(), 0);
  EXPECT_LT(a0.layer_begin(), a0.layer_end());
  EXPECT_EQ(a0.layer_end(), a1.layer_begin());
  EXPECT_LT(a1.layer_begin(), a1.layer_end());
  EXPECT_EQ(a1.layer_end(), kLayers);

  job = WaitForState(id, v1::RUNNING);
  EXPECT_EQ(job.status().epoch(), 1);
  ASSERT_EQ(job.status().stages_size(), 2);
  EXPECT_EQ(job.status().stages(0).worker_id(), "w1");
  EXPECT_EQ(job.status().stages(1).worker_id(), "w2");
  EXPECT_EQ(job.status().stages(1).layer_begin(), a1.layer_begin());
  ASSERT_NE(Condition(job, "Running"), nullptr);
  EXPECT_TRUE(Condition(job, "Running")->status());
  EXPECT_TRUE(Condition(job, "Scheduled")->status());
  for (const v1::WorkerInfo &w : Workers()) {
    EXPECT_EQ(w.state(), v1::BUSY) << w.worker_id();
    EXPECT_EQ(w.job_id(), id);
  }

  // The job's step is the slowest stage's; loss and speed are the last's.
  ASSERT_TRUE(w1->Progress(a0, 3));
  ASSERT_TRUE(w2->Progress(a1, 2, /*loss=*/1.5, /*step_seconds=*/0.5));
  job = WaitForJob(id, [](const v1::Job &j) {
    return j.status().step() == 2 && j.status().loss() == 1.5;
  });
  EXPECT_DOUBLE_EQ(job.status().samples_per_second(), 64.0);
  ASSERT_TRUE(w2->Progress(a1, 3, 1.25, 0.5));
  job = WaitForJob(id, [](const v1::Job &j) { return j.status().step() == 3; });
  EXPECT_DOUBLE_EQ(job.status().loss(), 1.25);

  // Both stages finish: their parameters are merged into one file.
  ASSERT_TRUE(w1->Send(Finished(a0, WriteStageParameters(a0))));
  v1::WorkerMessage last = Finished(a1, WriteStageParameters(a1));
  last.mutable_finished()->mutable_evaluation()->set_loss(0.25);
  last.mutable_finished()->mutable_evaluation()->set_accuracy(0.875);
  last.mutable_finished()->mutable_evaluation()->set_counted(64);
  ASSERT_TRUE(w2->Send(last));
  job = WaitForState(id, v1::SUCCEEDED);
  EXPECT_EQ(job.status().step(), 10);
  EXPECT_DOUBLE_EQ(job.status().evaluation().accuracy(), 0.875);
  EXPECT_EQ(job.status().evaluation().counted(), 64);
  ASSERT_NE(Condition(job, "Complete"), nullptr);
  EXPECT_TRUE(Condition(job, "Complete")->status());
  EXPECT_FALSE(Condition(job, "Running")->status());
  EXPECT_TRUE(job.status().has_finished());
  EXPECT_EQ(job.status().model_path(),
            (dir_ / "checkpoints" / id / "model.safetensors").string());
  absl::StatusOr<SafetensorsFile> model =
      ReadSafetensors(job.status().model_path());
  ASSERT_TRUE(model.ok()) << model.status();
  // The metadata gpipectl train writes, so the two files can be compared.
  EXPECT_EQ(model->metadata, ModelFileMetadata(SpecWithStages(2), 10));
  EXPECT_EQ(model->metadata["format"], "pt");
  ASSERT_EQ(model->tensors.size(), static_cast<size_t>(kLayers));
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    const std::string name = absl::StrCat("layers.", layer, ".weight");
    ASSERT_EQ(model->tensors.count(name), 1u) << name;
    EXPECT_EQ(model->tensors[name].ToVector(),
              std::vector<float>(6, static_cast<float>(layer)));
  }
  for (const v1::WorkerInfo &w : Workers()) {
    EXPECT_EQ(w.state(), v1::IDLE) << w.worker_id();
    EXPECT_EQ(w.job_id(), "");
  }

  // The watch saw every transition and ended after the terminal one.
  EXPECT_TRUE(watcher.Wait().ok());
  EXPECT_EQ(watcher.States(), (std::vector<v1::JobState>{
                                  v1::PENDING, v1::RUNNING, v1::SUCCEEDED}));
}

TEST_F(ControllerTest, CancelRunningJobFreesItsWorkers) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  std::unique_ptr<FakeWorker> w2 = AttachWorker(2);
  const std::string id = SubmitOk(SpecWithStages(2)).id();
  const v1::Assignment a0 = w1->NextAssignment();
  const v1::Assignment a1 = w2->NextAssignment();
  WaitForState(id, v1::RUNNING);

  v1::Job job;
  ASSERT_TRUE(Cancel(id, &job).ok());
  EXPECT_EQ(job.status().state(), v1::CANCELLED);
  const v1::Condition *cancelled = Condition(job, "Cancelled");
  ASSERT_NE(cancelled, nullptr);
  EXPECT_TRUE(cancelled->status());
  EXPECT_EQ(cancelled->reason(), "UserRequested");
  for (FakeWorker *w : {w1.get(), w2.get()}) {
    const v1::CancelAssignment cancel = w->NextCancel();
    EXPECT_EQ(cancel.job_id(), id);
    EXPECT_EQ(cancel.epoch(), 1);
    EXPECT_FALSE(cancel.reason().empty());
  }
  for (const v1::WorkerInfo &w : Workers()) {
    EXPECT_EQ(w.state(), v1::IDLE) << w.worker_id();
  }
  // Late reports of the cancelled job change nothing.
  ASSERT_TRUE(w2->Progress(a1, 5, 1.0, 0.1));
  ASSERT_TRUE(w1->Send(Finished(a0, "/nonexistent")));
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(Get(id, &job).ok());
  EXPECT_EQ(job.status().state(), v1::CANCELLED);
  EXPECT_EQ(job.status().step(), 0);

  // An ended job cannot be cancelled again; a pending one can.
  EXPECT_EQ(Cancel(id, &job).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  const std::string pending = SubmitOk(SpecWithStages(3)).id();
  ASSERT_TRUE(Cancel(pending, &job).ok());
  EXPECT_EQ(job.status().state(), v1::CANCELLED);
}

TEST_F(ControllerTest, TwoJobsRunAtOnceOnDisjointWorkers) {
  StartController();
  std::vector<std::unique_ptr<FakeWorker>> workers;
  for (int i = 1; i <= 4; ++i) workers.push_back(AttachWorker(i));
  const std::string a = SubmitOk(SpecWithStages(2)).id();
  const std::string b = SubmitOk(SpecWithStages(2)).id();
  const v1::Job third = SubmitOk(SpecWithStages(2));
  EXPECT_EQ(third.status().state(), v1::PENDING);
  EXPECT_EQ(Condition(third, "Scheduled")->message(),
            "needs 2 workers, 0 free");

  std::map<std::string, std::set<std::string>> by_job;
  for (const auto &w : workers) {
    const v1::Assignment assignment = w->NextAssignment();
    by_job[assignment.job_id()].insert(w->id());
    EXPECT_FALSE(w->Next(absl::Milliseconds(50)).has_value())
        << w->id() << " got a second message";
  }
  ASSERT_EQ(by_job.size(), 2u);
  EXPECT_EQ(by_job[a], (std::set<std::string>{"w1", "w2"}));
  EXPECT_EQ(by_job[b], (std::set<std::string>{"w3", "w4"}));
  EXPECT_EQ(WaitForState(a, v1::RUNNING).status().state(), v1::RUNNING);
  EXPECT_EQ(WaitForState(b, v1::RUNNING).status().state(), v1::RUNNING);

  // Jobs list newest first.
  grpc::ClientContext context;
  v1::ListJobsResponse jobs;
  ASSERT_TRUE(stub_->ListJobs(&context, v1::ListJobsRequest(), &jobs).ok());
  ASSERT_EQ(jobs.jobs_size(), 3);
  EXPECT_EQ(jobs.jobs(0).id(), third.id());
  EXPECT_EQ(jobs.jobs(1).id(), b);
  EXPECT_EQ(jobs.jobs(2).id(), a);

  // Cancelling the first frees two workers: the third job takes them.
  v1::Job job;
  ASSERT_TRUE(Cancel(a, &job).ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(workers[i]->NextCancel().job_id() == a);
    EXPECT_EQ(workers[i]->NextAssignment().job_id(), third.id());
  }
  WaitForState(third.id(), v1::RUNNING);
}

TEST_F(ControllerTest, AttachWithoutHelloIsFailedPrecondition) {
  StartController();
  FakeWorker worker(*stub_, "w1", "127.0.0.1:9001");
  v1::WorkerMessage beat;
  beat.mutable_heartbeat();
  worker.Send(beat);
  const grpc::Status status = worker.WaitClosed();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "first message must be hello");
  EXPECT_TRUE(Workers().empty());

  // A hello without an address is rejected too.
  FakeWorker nameless(*stub_, "w2", "");
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id("w2");
  nameless.Send(hello);
  EXPECT_EQ(nameless.WaitClosed().error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// A job that allows no restarts (max_restarts 0; the default is
// kDefaultMaxRestarts) fails at its first lost worker.
TEST_F(ControllerTest, BrokenStreamOfBusyWorkerFailsJobWithWorkerLost) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  std::unique_ptr<FakeWorker> w2 = AttachWorker(2);
  v1::JobSpec spec = SpecWithStages(2);
  spec.set_max_restarts(0);
  const std::string id = SubmitOk(spec).id();
  const v1::Assignment a0 = w1->NextAssignment();
  const v1::Assignment a1 = w2->NextAssignment();
  ASSERT_TRUE(w1->Progress(a0, 3));
  ASSERT_TRUE(w2->Progress(a1, 3, 1.0, 0.1));
  WaitForJob(id, [](const v1::Job &j) { return j.status().step() == 3; });

  w2->Break();
  const v1::Job job = WaitForState(id, v1::FAILED);
  const v1::Condition *failed = Condition(job, "Failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->reason(), "WorkerLost");
  EXPECT_THAT(failed->message(),
              HasSubstr("worker w2 at 127.0.0.1:9002 was lost at step 3"));
  EXPECT_EQ(w1->NextCancel().job_id(), id);
  const std::vector<v1::WorkerInfo> workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id(), "w1");
  EXPECT_EQ(workers[0].state(), v1::IDLE);
}

TEST_F(ControllerTest, ExpiredLeaseFailsJobWithWorkerLost) {
  StartController(/*heartbeat_timeout=*/absl::Milliseconds(500));
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  std::unique_ptr<FakeWorker> w2 = AttachWorker(2);
  w1->StartHeartbeats(absl::Milliseconds(50));
  v1::JobSpec spec = SpecWithStages(2);
  spec.set_max_restarts(0);
  const std::string id = SubmitOk(spec).id();
  w1->NextAssignment();
  w2->NextAssignment();
  // w2 says nothing more: its lease runs out.
  const v1::Job job = WaitForState(id, v1::FAILED);
  const v1::Condition *failed = Condition(job, "Failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->reason(), "WorkerLost");
  EXPECT_THAT(failed->message(), HasSubstr("worker w2 at 127.0.0.1:9002"));
  EXPECT_THAT(failed->message(), HasSubstr("no heartbeat"));
  // The controller ended its stream (a sync handler can only cancel it).
  const grpc::Status status = w2->WaitClosed();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(w1->NextCancel().job_id(), id);
  // The worker that kept beating is still there, free.
  absl::SleepFor(absl::Milliseconds(700));
  const std::vector<v1::WorkerInfo> workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id(), "w1");
  EXPECT_EQ(workers[0].state(), v1::IDLE);
}

TEST_F(ControllerTest, ReportsOfAnotherEpochOrStageAreIgnored) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  std::unique_ptr<FakeWorker> w2 = AttachWorker(2);
  const std::string id = SubmitOk(SpecWithStages(2)).id();
  const v1::Assignment a0 = w1->NextAssignment();
  const v1::Assignment a1 = w2->NextAssignment();
  ASSERT_EQ(a0.epoch(), 1);

  v1::Assignment stale0 = a0;
  stale0.set_epoch(0);
  v1::Assignment future1 = a1;
  future1.set_epoch(2);
  v1::Assignment wrong_stage = a1;  // w1 claiming stage 1
  ASSERT_TRUE(w1->Progress(stale0, 7));
  ASSERT_TRUE(w2->Progress(future1, 7, 0.5, 0.1));
  ASSERT_TRUE(w1->Progress(wrong_stage, 7, 0.5, 0.1));
  ASSERT_TRUE(w1->Send(Finished(stale0, "/nonexistent")));
  ASSERT_TRUE(w2->Send(Finished(future1, "/nonexistent")));
  Controller &controller = server_->controller();
  const absl::Time deadline = absl::Now() + kWait;
  while (controller.ignored_reports() < 5 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(controller.ignored_reports(), 5);
  v1::Job job;
  ASSERT_TRUE(Get(id, &job).ok());
  EXPECT_EQ(job.status().state(), v1::RUNNING);
  EXPECT_EQ(job.status().step(), 0);
  EXPECT_EQ(job.status().loss(), 0);

  // Reports of the current epoch count.
  ASSERT_TRUE(w1->Progress(a0, 1));
  ASSERT_TRUE(w2->Progress(a1, 1, 2.0, 0.1));
  job = WaitForJob(id, [](const v1::Job &j) { return j.status().step() == 1; });
  EXPECT_DOUBLE_EQ(job.status().loss(), 2.0);
}

TEST_F(ControllerTest, StageFailureFailsJobAndCancelsTheOtherStages) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  std::unique_ptr<FakeWorker> w2 = AttachWorker(2);
  const std::string id = SubmitOk(SpecWithStages(2)).id();
  w1->NextAssignment();
  const v1::Assignment a1 = w2->NextAssignment();
  v1::WorkerMessage m;
  v1::StageFailed &f = *m.mutable_failed();
  f.set_job_id(id);
  f.set_epoch(a1.epoch());
  f.set_stage(1);
  f.set_message("loss is not finite at step 4");
  f.set_permanent(true);
  f.set_reason("LossNotFinite");
  ASSERT_TRUE(w2->Send(m));
  const v1::Job job = WaitForState(id, v1::FAILED);
  const v1::Condition *failed = Condition(job, "Failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->reason(), "LossNotFinite");
  EXPECT_THAT(failed->message(), HasSubstr("loss is not finite at step 4"));
  EXPECT_EQ(w1->NextCancel().job_id(), id);
  EXPECT_FALSE(w2->Next(absl::Milliseconds(100)).has_value());
  for (const v1::WorkerInfo &w : Workers()) {
    EXPECT_EQ(w.state(), v1::IDLE) << w.worker_id();
  }
}

TEST_F(ControllerTest, FinishedStageWithUnreadableParametersFailsTheJob) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  const std::string id = SubmitOk(SpecWithStages(1)).id();
  const v1::Assignment a = w1->NextAssignment();
  EXPECT_EQ(a.layer_begin(), 0);
  EXPECT_EQ(a.layer_end(), kLayers);
  ASSERT_TRUE(w1->Send(Finished(a, FinalPath(a))));  // never written
  const v1::Job job = WaitForState(id, v1::FAILED);
  EXPECT_EQ(Condition(job, "Failed")->reason(), "MergeFailed");
  EXPECT_THAT(Condition(job, "Failed")->message(), HasSubstr(FinalPath(a)));
}

v1::WorkerMessage Evaluated(const v1::Assignment &a, int64_t step, double loss,
                            double accuracy, int64_t counted = 64) {
  v1::WorkerMessage m;
  v1::StageEvaluated &r = *m.mutable_evaluated();
  r.set_job_id(a.job_id());
  r.set_epoch(a.epoch());
  r.set_stage(a.stage());
  r.mutable_evaluation()->set_step(step);
  r.mutable_evaluation()->set_loss(loss);
  r.mutable_evaluation()->set_accuracy(accuracy);
  r.mutable_evaluation()->set_counted(counted);
  return m;
}

// Reports an attached worker might send by mistake or malice: each is
// ignored with a log line and counted, and the job goes on unharmed to
// SUCCEEDED with the figures of the honest reports only.
TEST_F(ControllerTest, HostileReportsAreIgnoredAndTheJobCompletes) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  std::unique_ptr<FakeWorker> w2 = AttachWorker(2);
  v1::JobSpec spec = SpecWithStages(2);
  spec.mutable_checkpoint()->set_every(2);
  spec.mutable_eval()->set_every(4);
  const std::string id = SubmitOk(spec).id();
  const v1::Assignment a0 = w1->NextAssignment();
  const v1::Assignment a1 = w2->NextAssignment();
  WaitForState(id, v1::RUNNING);
  Controller &controller = server_->controller();
  const std::filesystem::path job_dir = dir_ / "checkpoints" / id;
  std::filesystem::create_directories(job_dir);
  // A file outside the job's directory that must never be read or listed.
  const std::filesystem::path secret = dir_ / "secret.safetensors";
  std::ofstream(secret) << "not yours";

  std::vector<v1::WorkerMessage> hostile;
  v1::Assignment unknown = a0;
  unknown.set_job_id("job-deadbeef");
  hostile.push_back(Finished(unknown, FinalPath(unknown)));
  v1::Assignment future = a1;
  future.set_epoch(a1.epoch() + 1000);
  hostile.push_back(Evaluated(future, 4, 0.5, 0.5));
  v1::Assignment beyond = a1;
  beyond.set_stage(99);
  hostile.push_back(Checkpointed(beyond, 2));
  // Absurd steps.
  v1::WorkerMessage m;
  for (int64_t step : {int64_t{-5}, int64_t{11}, INT64_MAX}) {
    m.Clear();
    m.mutable_progress()->set_job_id(id);
    m.mutable_progress()->set_epoch(a1.epoch());
    m.mutable_progress()->set_stage(1);
    m.mutable_progress()->set_step(step);
    m.mutable_progress()->set_loss(9.0);
    hostile.push_back(m);
  }
  // Figures no stage measures: a loss or a time that is no number, a
  // negative time (stored, they showed on the job as loss=nan).
  for (int i = 0; i < 3; ++i) {
    m.Clear();
    v1::StepProgress &p = *m.mutable_progress();
    p.set_job_id(id);
    p.set_epoch(a1.epoch());
    p.set_stage(1);
    p.set_step(1);
    if (i == 0) p.set_loss(std::nan(""));
    if (i == 1) p.set_step_seconds(-1);
    if (i == 2) p.set_busy_seconds(INFINITY);
    hostile.push_back(m);
  }
  // A checkpoint of a step the stage never reported reaching (it was
  // committed, with the job at step 0).
  hostile.push_back(Checkpointed(a0, 2));
  // Traces of steps the job has not, or that end before they start.
  for (auto [step, start, end] :
       {std::tuple{int64_t{-7}, 1, 2}, std::tuple{int64_t{1} << 62, 1, 2},
        std::tuple{int64_t{1}, 5, 2}}) {
    m.Clear();
    v1::StepTrace &t = *m.mutable_trace();
    t.set_job_id(id);
    t.set_epoch(a1.epoch());
    t.set_stage(1);
    t.set_step(step);
    t.set_start_unix_ns(start);
    t.set_end_unix_ns(end);
    hostile.push_back(m);
  }
  // Path traversal: final parameters and checkpoint files elsewhere.
  hostile.push_back(Finished(a1, secret.string()));
  hostile.push_back(Finished(a1, "/etc/passwd"));
  hostile.push_back(Finished(
      a1, absl::StrCat(a1.output_dir(), "/../../../secret.safetensors")));
  m = Checkpointed(a0, 2);
  m.mutable_checkpointed()->set_path(
      absl::StrCat(a0.checkpoint_dir(), "/step-2/../../../secret.safetensors"));
  hostile.push_back(m);
  m = Checkpointed(a0, 2);
  m.mutable_checkpointed()->set_path(secret.string());
  hostile.push_back(m);
  m = Checkpointed(a0, 2);  // another stage's file
  m.mutable_checkpointed()->set_stage(1);
  hostile.push_back(m);
  // Checkpoints of a step that is none, past the end, or layers not its own.
  hostile.push_back(Checkpointed(a0, 3));
  hostile.push_back(Checkpointed(a0, 1'000'000'000'000));
  m = Checkpointed(a0, 2);
  m.mutable_checkpointed()->set_layer_end(kLayers + 100);
  hostile.push_back(m);
  // Evaluations: not the last stage, not an evaluation step, not a number.
  hostile.push_back(Evaluated(a0, 4, 0.5, 0.5));
  hostile.push_back(Evaluated(a1, 3, 0.5, 0.5));
  hostile.push_back(Evaluated(a1, INT64_MAX, 0.5, 0.5));
  hostile.push_back(Evaluated(a1, 4, std::nan(""), 0.5));
  hostile.push_back(Evaluated(a1, 4, 0.5, 7.0));
  hostile.push_back(Evaluated(a1, 4, 0.5, 0.5, /*counted=*/0));
  const int64_t ignored = controller.ignored_reports();
  for (const v1::WorkerMessage &h : hostile) {
    FakeWorker &from =
        h.has_checkpointed() && h.checkpointed().stage() == 0 ? *w1 : *w2;
    ASSERT_TRUE(from.Send(h));
  }
  v1::WorkerMessage empty;
  ASSERT_TRUE(w1->Send(empty));  // no kind at all: logged, not counted
  const int64_t want = ignored + static_cast<int64_t>(hostile.size());
  const absl::Time deadline = absl::Now() + kWait;
  while (controller.ignored_reports() < want && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(controller.ignored_reports(), want);
  v1::Job job;
  ASSERT_TRUE(Get(id, &job).ok());
  EXPECT_EQ(job.status().state(), v1::RUNNING);
  EXPECT_EQ(job.status().step(), 0);
  EXPECT_EQ(job.status().loss(), 0);
  EXPECT_EQ(job.status().checkpoints_size(), 0);
  EXPECT_FALSE(job.status().has_latest_evaluation());
  for (const auto &entry :
       std::filesystem::recursive_directory_iterator(job_dir)) {
    EXPECT_NE(entry.path().filename(), storage::kManifestName) << entry.path();
  }
  EXPECT_TRUE(std::filesystem::exists(secret));

  // Honest reports still count: a checkpoint, two evaluations (the second
  // of step 4 is a replay and replaces the first), the final evaluation.
  ASSERT_TRUE(w1->Progress(a0, 2));
  ASSERT_TRUE(w1->Send(Checkpointed(a0, 2)));
  ASSERT_TRUE(w2->Progress(a1, 2));
  ASSERT_TRUE(w2->Send(Checkpointed(a1, 2)));
  job = WaitForJob(
      id, [](const v1::Job &j) { return j.status().checkpoints_size() == 1; });
  // The same step again is no newer checkpoint (an older one moved the
  // list back and left the newer directory behind).
  const int64_t before_again = controller.ignored_reports();
  ASSERT_TRUE(w1->Send(Checkpointed(a0, 2)));
  for (const absl::Time until = absl::Now() + kWait;
       controller.ignored_reports() == before_again && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(controller.ignored_reports(), before_again + 1);
  ASSERT_TRUE(w2->Send(Evaluated(a1, 4, 1.5, 0.25)));
  ASSERT_TRUE(w2->Send(Evaluated(a1, 8, 1.0, 0.5)));
  ASSERT_TRUE(w2->Send(Evaluated(a1, 4, 1.25, 0.375)));
  // Until all three are in: the first alone already has step 4.
  job = WaitForJob(id, [](const v1::Job &j) {
    return j.status().evaluations_size() == 2 &&
           j.status().evaluations(0).loss() == 1.25;
  });
  ASSERT_EQ(job.status().evaluations_size(), 2);
  EXPECT_EQ(job.status().latest_evaluation().step(), 4);
  EXPECT_EQ(job.status().evaluations(0).step(), 4);
  EXPECT_EQ(job.status().evaluations(0).loss(), 1.25);
  EXPECT_EQ(job.status().evaluations(1).step(), 8);
  EXPECT_EQ(job.status().evaluations(1).accuracy(), 0.5);
  ASSERT_TRUE(w1->Send(Finished(a0, WriteStageParameters(a0))));
  v1::WorkerMessage last = Finished(a1, WriteStageParameters(a1));
  last.mutable_finished()->mutable_evaluation()->set_loss(0.75);
  last.mutable_finished()->mutable_evaluation()->set_accuracy(0.625);
  last.mutable_finished()->mutable_evaluation()->set_counted(64);
  ASSERT_TRUE(w2->Send(last));
  job = WaitForState(id, v1::SUCCEEDED);
  EXPECT_EQ(job.status().evaluation().step(), 10);
  EXPECT_EQ(job.status().latest_evaluation().step(), 10);
  EXPECT_EQ(job.status().latest_evaluation().loss(), 0.75);
  ASSERT_EQ(job.status().evaluations_size(), 3);
  EXPECT_EQ(job.status().evaluations(2).step(), 10);
  EXPECT_TRUE(std::filesystem::exists(secret));
}

// A worker's channel pings every 2 s (KeepaliveChannelArguments); between
// heartbeats of a long --heartbeat_interval_ms an idle worker sends nothing
// else. The controller took a ping closer than 5 s after the last one as a
// strike and ended the connection at the third ("too_many_pings"), so idle
// workers detached and attached again every few seconds.
TEST_F(ControllerTest, AnIdleWorkerBetweenLongHeartbeatsStaysAttached) {
  ControllerServerOptions options;
  options.listen = "127.0.0.1:0";
  options.controller.checkpoint_dir = (dir_ / "checkpoints").string();
  options.controller.heartbeat_interval = absl::Seconds(10);
  options.controller.heartbeat_timeout = absl::Seconds(60);
  auto server = ControllerServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = std::move(*server);
  auto channel = grpc::CreateCustomChannel(server_->address(),
                                           grpc::InsecureChannelCredentials(),
                                           KeepaliveChannelArguments());
  auto stub = v1::Controller::NewStub(channel);
  FakeWorker worker(*stub, "w1", "127.0.0.1:9001");
  worker.Attach();
  const grpc::Status ended = worker.WaitClosed(absl::Seconds(9));
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << "the controller ended an idle worker's stream: "
      << ended.error_message();
}

TEST_F(ControllerTest, SameWorkerAttachingAgainReplacesItsOldStream) {
  StartController();
  std::unique_ptr<FakeWorker> first = AttachWorker(1);
  std::unique_ptr<FakeWorker> again = AttachWorker(1);
  const grpc::Status status = first->WaitClosed();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const std::vector<v1::WorkerInfo> workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].worker_id(), "w1");
  // The new stream is the one that gets work.
  SubmitOk(SpecWithStages(1));
  EXPECT_EQ(again->NextAssignment().stage(), 0);
}

// A hello under the id of a live worker with another session key (a forged
// one) is refused: the live worker keeps its stage and the job counts no
// restart. The worker itself re-attaching with its key still replaces its
// old stream.
TEST_F(ControllerTest, AForgedHelloCannotTakeALiveWorkersId) {
  StartController();
  auto real = std::make_unique<FakeWorker>(*stub_, "w1", "127.0.0.1:9001");
  real->Attach("key-of-w1");
  const v1::Job job = SubmitOk(SpecWithStages(1));
  EXPECT_EQ(real->NextAssignment().stage(), 0);
  for (const std::string key : {"", "key-of-someone-else"}) {
    FakeWorker forged(*stub_, "w1", "127.0.0.1:9666");
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id("w1");
    hello.mutable_hello()->set_address("127.0.0.1:9666");
    hello.mutable_hello()->set_session_key(key);
    forged.Send(hello);
    const grpc::Status refused = forged.WaitClosed();
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::ALREADY_EXISTS)
        << refused.error_message();
  }
  v1::Job now;
  ASSERT_TRUE(Get(job.id(), &now).ok());
  EXPECT_EQ(now.status().state(), v1::RUNNING);
  EXPECT_EQ(now.status().restarts(), 0);
  const std::vector<v1::WorkerInfo> workers = Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].address(), "127.0.0.1:9001");
  // The real one, reconnecting: same key, replaces its stream.
  auto again = std::make_unique<FakeWorker>(*stub_, "w1", "127.0.0.1:9001");
  again->Attach("key-of-w1");
  EXPECT_FALSE(real->WaitClosed().ok());
}

// ListJobs pages through summaries, newest first; DeleteJob removes an
// ended job (record and files) and refuses a running one.
TEST_F(ControllerTest, JobsAreListedInPagesAndDeletedWhenEnded) {
  StartController();
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(SubmitOk(SpecWithStages(1)).id());
  std::vector<std::string> listed;
  v1::ListJobsRequest request;
  request.set_page_size(2);
  int pages = 0;
  do {
    grpc::ClientContext context;
    v1::ListJobsResponse page;
    ASSERT_TRUE(stub_->ListJobs(&context, request, &page).ok());
    ++pages;
    EXPECT_LE(page.jobs_size(), 2);
    for (const v1::Job &job : page.jobs()) {
      listed.push_back(job.id());
      EXPECT_EQ(job.spec().model().layers_size(), 0) << "not a summary";
      EXPECT_EQ(job.spec().name(), "controller-test");
    }
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(listed, std::vector<std::string>(ids.rbegin(), ids.rend()));
  {
    grpc::ClientContext context;
    v1::ListJobsRequest bad;
    bad.set_page_token("not-a-token");
    v1::ListJobsResponse page;
    EXPECT_EQ(stub_->ListJobs(&context, bad, &page).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    // A 200 KB token is refused as a token, not echoed whole (that outgrew
    // gRPC's metadata limit: a transport error).
    grpc::ClientContext context;
    v1::ListJobsRequest bad;
    bad.set_page_token(std::string(200'000, '7') + "x");
    v1::ListJobsResponse page;
    const grpc::Status s = stub_->ListJobs(&context, bad, &page);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << s.error_message().substr(0, 200);
    EXPECT_LT(s.error_message().size(), 200u);
  }

  const auto remove = [&](const std::string &id) {
    grpc::ClientContext context;
    v1::DeleteJobRequest r;
    r.set_job_id(id);
    v1::DeleteJobResponse out;
    return stub_->DeleteJob(&context, r, &out);
  };
  EXPECT_EQ(remove(ids[0]).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::Job cancelled;
  ASSERT_TRUE(Cancel(ids[0], &cancelled).ok());
  const std::filesystem::path files = dir_ / "checkpoints" / ids[0];
  std::filesystem::create_directories(files / "step-2");
  EXPECT_TRUE(remove(ids[0]).ok());
  v1::Job gone;
  EXPECT_EQ(Get(ids[0], &gone).error_code(), grpc::StatusCode::NOT_FOUND);
  // Gone when the call returns: a script that looked right after found
  // them all still there.
  EXPECT_FALSE(std::filesystem::exists(files));
  EXPECT_EQ(remove(ids[0]).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ControllerTest, ShutdownEndsAttachAndWatchStreams) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  const std::string id = SubmitOk(SpecWithStages(2)).id();
  Watcher watcher(*stub_, id);
  ASSERT_TRUE(watcher.WaitForEvents(1));
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Seconds(2));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  const grpc::Status attach = w1->WaitClosed();
  EXPECT_FALSE(attach.ok());
  EXPECT_NE(attach.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  const grpc::Status watch = watcher.Wait();
  EXPECT_EQ(watch.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(watch.error_message(), HasSubstr("shutting down"));
}

// The state machine under faults: checkpoints commit when every stage has
// reported; a lost worker puts the job in RESTARTING and its stages go, under
// a new epoch, to free workers that restore the newest intact checkpoint
// (a corrupt one is skipped and counted); reports of the old epoch are
// ignored; once max_restarts are used up the next loss fails the job.
TEST_F(ControllerTest, LostWorkerRestartsFromNewestIntactCheckpoint) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  std::unique_ptr<FakeWorker> w2 = AttachWorker(2);
  std::unique_ptr<FakeWorker> w3 = AttachWorker(3);
  const std::string id = SubmitOk(RecoverableSpec(2, 1)).id();
  const v1::Assignment a0 = w1->NextAssignment();
  const v1::Assignment a1 = w2->NextAssignment();
  EXPECT_EQ(a0.checkpoint_dir(), (dir_ / "checkpoints" / id).string());
  EXPECT_EQ(a0.restore_manifest(), "");

  // Step 2: one stage is not a checkpoint yet; both are.
  ASSERT_TRUE(w1->Progress(a0, 2));
  ASSERT_TRUE(w1->Send(Checkpointed(a0, 2)));
  absl::SleepFor(absl::Milliseconds(100));
  v1::Job job;
  ASSERT_TRUE(Get(id, &job).ok());
  EXPECT_EQ(job.status().checkpoints_size(), 0);
  ASSERT_TRUE(w2->Progress(a1, 2));
  ASSERT_TRUE(w2->Send(Checkpointed(a1, 2)));
  ASSERT_TRUE(w1->Progress(a0, 4));
  ASSERT_TRUE(w1->Send(Checkpointed(a0, 4)));
  ASSERT_TRUE(w2->Progress(a1, 4));
  ASSERT_TRUE(w2->Send(Checkpointed(a1, 4)));
  job = WaitForJob(
      id, [](const v1::Job &j) { return j.status().checkpoints_size() == 2; });
  const std::string manifest2 = job.status().checkpoints(0).manifest_path();
  const std::string manifest4 = job.status().checkpoints(1).manifest_path();
  absl::StatusOr<v1::CheckpointManifest> m4 =
      storage::ReadVerifiedManifest(manifest4);
  ASSERT_TRUE(m4.ok()) << m4.status();
  EXPECT_EQ(m4->step(), 4);
  ASSERT_EQ(m4->files_size(), 2);
  EXPECT_EQ(m4->files(1).layer_end(), kLayers);

  // A report that names a file outside its place is ignored.
  v1::WorkerMessage elsewhere = Checkpointed(a0, 6);
  elsewhere.mutable_checkpointed()->set_path("/etc/passwd");
  ASSERT_TRUE(w1->Send(elsewhere));

  // The newest checkpoint is corrupt, then a worker is lost.
  std::ofstream(
      std::filesystem::path(manifest4).parent_path() / "e1-stage-0.safetensors",
      std::ios::binary)
      << "stage 0 at step 5";
  w2->Break();
  EXPECT_EQ(w1->NextCancel().epoch(), 1);
  const v1::Assignment b0 = w1->NextAssignment();
  const v1::Assignment b1 = w3->NextAssignment();
  for (const v1::Assignment *b : {&b0, &b1}) {
    EXPECT_EQ(b->epoch(), 2);
    EXPECT_EQ(b->start_step(), 2);
    EXPECT_EQ(b->restore_manifest(), manifest2);
    EXPECT_EQ(b->stages(), 2);
  }
  job = WaitForState(id, v1::RUNNING);
  EXPECT_EQ(job.status().restarts(), 1);
  EXPECT_EQ(job.status().step(), 2);
  ASSERT_EQ(job.status().checkpoints_size(), 1);
  EXPECT_EQ(server_->controller().corrupt_checkpoints(), 1);
  EXPECT_EQ(Condition(job, "Running")->reason(), "Started");
  // The user sees it on the job, not only in the controller's log.
  ASSERT_NE(Condition(job, "Restored"), nullptr);
  EXPECT_TRUE(Condition(job, "Restored")->status());
  EXPECT_THAT(Condition(job, "Restored")->message(),
              ::testing::HasSubstr("1 corrupt checkpoint dropped (the newest, "
                                   "of step 4: "));
  EXPECT_THAT(Condition(job, "Restored")->message(),
              ::testing::HasSubstr("restoring the checkpoint of step 2"));

  // The old epoch's reports no longer count.
  const int64_t ignored = server_->controller().ignored_reports();
  ASSERT_TRUE(w1->Progress(a0, 9));
  ASSERT_TRUE(w1->Send(Checkpointed(a0, 6)));
  ASSERT_TRUE(w1->Send(Finished(a0, "/nonexistent")));
  const absl::Time deadline = absl::Now() + kWait;
  while (server_->controller().ignored_reports() < ignored + 3 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(server_->controller().ignored_reports(), ignored + 3);
  ASSERT_TRUE(Get(id, &job).ok());
  EXPECT_EQ(job.status().step(), 2);

  // The one restart allowed is used up.
  w3->Break();
  job = WaitForState(id, v1::FAILED);
  EXPECT_EQ(Condition(job, "Failed")->reason(), "WorkerLost");
  EXPECT_THAT(Condition(job, "Failed")->message(),
              HasSubstr("no restarts left (max_restarts 1)"));
}

// A stage failure that may pass restarts the job; a permanent one (a loss
// that is not finite) fails it even with restarts left.
TEST_F(ControllerTest, TransientFailureRestartsAndPermanentOneFails) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  const std::string id = SubmitOk(RecoverableSpec(1, 5)).id();
  const v1::Assignment a = w1->NextAssignment();
  v1::WorkerMessage m;
  v1::StageFailed &f = *m.mutable_failed();
  f.set_job_id(id);
  f.set_epoch(a.epoch());
  f.set_stage(0);
  f.set_message("checkpoint: disk full");
  f.set_reason("CheckpointFailed");
  ASSERT_TRUE(w1->Send(m));
  const v1::Assignment b = w1->NextAssignment();
  EXPECT_EQ(b.epoch(), a.epoch() + 1);
  EXPECT_EQ(b.start_step(), 0);
  f.set_epoch(b.epoch());
  f.set_message("loss is not finite (nan) at step 3");
  f.set_reason("LossNotFinite");
  f.set_permanent(true);
  ASSERT_TRUE(w1->Send(m));
  const v1::Job job = WaitForState(id, v1::FAILED);
  EXPECT_EQ(job.status().restarts(), 1);
  EXPECT_EQ(Condition(job, "Failed")->reason(), "LossNotFinite");
}

// Killed and started again on the same store, the controller still knows
// its jobs: an unfinished one waits as RESTARTING and resumes from its last
// committed checkpoint under a new epoch on the workers that attach.
TEST_F(ControllerTest, RestartedControllerResumesJobsFromItsStore) {
  store_path_ = (dir_ / "jobs.db").string();
  StartController();
  std::string id;
  std::string manifest;
  {
    std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
    std::unique_ptr<FakeWorker> w2 = AttachWorker(2);
    id = SubmitOk(RecoverableSpec(2, 0)).id();
    const v1::Assignment a0 = w1->NextAssignment();
    const v1::Assignment a1 = w2->NextAssignment();
    ASSERT_TRUE(w1->Progress(a0, 2));
    ASSERT_TRUE(w1->Send(Checkpointed(a0, 2)));
    ASSERT_TRUE(w2->Progress(a1, 2));
    ASSERT_TRUE(w2->Send(Checkpointed(a1, 2)));
    const v1::Job job = WaitForJob(id, [](const v1::Job &j) {
      return j.status().checkpoints_size() == 1;
    });
    manifest = job.status().checkpoints(0).manifest_path();
    stub_.reset();
    server_.reset();
  }
  StartController();
  v1::Job job;
  ASSERT_TRUE(Get(id, &job).ok());
  EXPECT_EQ(job.status().state(), v1::RESTARTING);
  EXPECT_EQ(job.status().epoch(), 1);
  EXPECT_EQ(job.status().restarts(), 0);  // not the job's fault
  EXPECT_EQ(Condition(job, "Running")->reason(), "ControllerRestarted");
  std::unique_ptr<FakeWorker> w3 = AttachWorker(3);
  std::unique_ptr<FakeWorker> w4 = AttachWorker(4);
  const v1::Assignment b0 = w3->NextAssignment();
  const v1::Assignment b1 = w4->NextAssignment();
  EXPECT_EQ(b0.epoch(), 2);
  EXPECT_EQ(b1.start_step(), 2);
  EXPECT_EQ(b1.restore_manifest(), manifest);
  WaitForState(id, v1::RUNNING);
}

// Elastic: short of workers for longer than the grace period, a job runs on
// fewer stages (down to min_stages), and grows back at its next committed
// checkpoint once workers are free again.
TEST_F(ControllerTest, ElasticJobShrinksAndGrowsBackAtACheckpoint) {
  StartController();
  std::unique_ptr<FakeWorker> w1 = AttachWorker(1);
  std::unique_ptr<FakeWorker> w2 = AttachWorker(2);
  v1::JobSpec spec = RecoverableSpec(2, 3);
  spec.mutable_pipeline()->set_min_stages(1);
  spec.mutable_pipeline()->set_elastic_grace_ms(300);
  const std::string id = SubmitOk(spec).id();
  w1->NextAssignment();
  w2->NextAssignment();
  w2->Break();
  EXPECT_EQ(w1->NextCancel().epoch(), 1);
  // Nothing for a while: the grace period runs.
  EXPECT_FALSE(w1->Next(absl::Milliseconds(150)).has_value());
  const v1::Assignment solo = w1->NextAssignment();
  EXPECT_EQ(solo.stages(), 1);
  EXPECT_EQ(solo.layer_begin(), 0);
  EXPECT_EQ(solo.layer_end(), kLayers);
  v1::Job job = WaitForState(id, v1::RUNNING);
  EXPECT_EQ(job.status().running_stages(), 1);

  std::unique_ptr<FakeWorker> w3 = AttachWorker(3);
  EXPECT_FALSE(w3->Next(absl::Milliseconds(100)).has_value());
  ASSERT_TRUE(w1->Progress(solo, 2));
  ASSERT_TRUE(w1->Send(Checkpointed(solo, 2)));
  EXPECT_EQ(w1->NextCancel().epoch(), solo.epoch());
  const v1::Assignment b0 = w1->NextAssignment();
  const v1::Assignment b1 = w3->NextAssignment();
  EXPECT_EQ(b0.stages(), 2);
  EXPECT_EQ(b1.stage(), 1);
  EXPECT_EQ(b1.start_step(), 2);
  EXPECT_FALSE(b1.restore_manifest().empty());
  job = WaitForJob(id, [](const v1::Job &j) {
    return j.status().state() == v1::RUNNING &&
           j.status().running_stages() == 2;
  });
  EXPECT_EQ(job.status().restarts(), 1);  // growing back is not a restart
}

}  // namespace
}  // namespace gpipe::controller
