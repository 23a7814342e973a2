// Two workers in this process, each with its real gRPC Stage service on a
// loopback port, run a job's stages over gRPC links; the result is bitwise the
// reference trainer's. Bad links (another job, an old epoch, a header whose
// byte count does not match its shape, bytes that are no frame at all) are
// rejected with a clear status, and the workers keep serving.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/memory_model.h"
#include "services/pipeline/partitioner.h"
#include "services/pipeline/reference_trainer.h"
#include "services/storage/safetensors.h"
#include "services/transport/shm_segment.h"
#include "tests/support/worker_reports.h"
#include "worker/executor.h"
#include "worker/grpc_downstream_connector.h"
#include "worker/stage_service.h"

namespace gpipe {
namespace {

constexpr char kSpec[] = R"json({
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [8]}},
    "layers": [
      {"linear": {"inFeatures": 8, "outFeatures": 16}},
      {"batchNorm": {"features": 16}},
      {"relu": {}},
      {"dropout": {"p": 0.1}},
      {"linear": {"inFeatures": 16, "outFeatures": 3}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.05, "adamw": {}, "clipNorm": 0.5},
  "data": {"synthetic": {"task": "CLASSES", "features": 8, "classes": 3,
                         "trainSamples": 600, "testSamples": 100}},
  "batchSize": 30, "steps": 6, "seed": 4
})json";

using Reports = test_support::WorkerReports;

struct TestWorker {
  TestWorker(Reports* reports, int64_t link_wait_ms)
      : executor(
            1,
            [reports](const gpipe::v1::WorkerMessage& m) { reports->Add(m); }),
        service(&executor, link_wait_ms) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~TestWorker() {
    executor.CancelAll();
    server->Shutdown(std::chrono::system_clock::now() +
                     std::chrono::seconds(1));
  }
  Executor executor;
  StageService service;
  int port = 0;
  std::string address;
  std::unique_ptr<grpc::Server> server;
};

class WorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto spec = ParseJobSpecJson(kSpec);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    dir_ = std::filesystem::temp_directory_path() /
           ("gpipe-worker-test-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    a_ = std::make_unique<TestWorker>(&reports_, 300);
    b_ = std::make_unique<TestWorker>(&reports_, 300);
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    std::filesystem::remove_all(dir_);
  }

  gpipe::v1::Assignment Assign(int64_t stage, int64_t epoch,
                               const std::string& job) {
    const std::vector<int64_t> balance = *PartitionJob(spec_, 2);
    const std::vector<int64_t> begins = StageBegins(balance);
    gpipe::v1::Assignment a;
    a.set_job_id(job);
    a.set_epoch(epoch);
    *a.mutable_spec() = spec_;
    a.set_stage(stage);
    a.set_stages(2);
    a.set_layer_begin(begins[stage]);
    a.set_layer_end(begins[stage] + balance[stage]);
    a.set_micro_batches(4);
    a.set_schedule(schedule_);
    a.set_remat(gpipe::v1::ALWAYS);
    if (stage == 0) a.set_downstream_address(b_->address);
    if (stage == 1) a.set_upstream_address(a_->address);
    a.set_output_dir((dir_ / job).string());
    return a;
  }

  // Runs the job on the two workers and checks the merged parameters
  // against the reference trainer.
  void RunAndCompare(const std::string& job, int64_t epoch) {
    reports_.Clear();
    b_->executor.Start(Assign(1, epoch, job));
    a_->executor.Start(Assign(0, epoch, job));
    std::string failure;
    ASSERT_TRUE(reports_.WaitFinished(2, &failure)) << failure;
    auto ref = ReferenceTrainer::Create(spec_, 4);
    ASSERT_TRUE(ref.ok());
    for (int s = 0; s < spec_.steps(); ++s) ASSERT_TRUE((*ref)->Step().ok());
    std::map<std::string, Tensor> got;
    double last_loss = -1;
    for (const auto& m : reports_.All()) {
      if (m.has_progress() && m.progress().stage() == 1)
        last_loss = m.progress().loss();
      if (!m.has_finished()) continue;
      auto file = ReadSafetensors(m.finished().parameters_path());
      ASSERT_TRUE(file.ok()) << file.status();
      for (auto& [name, t] : file->tensors) got[name] = t;
    }
    EXPECT_GT(last_loss, 0);
    int compared = 0;
    for (const NamedTensor& t : (*ref)->StateTensors()) {
      ASSERT_TRUE(got.count(t.name)) << t.name;
      EXPECT_TRUE(BitwiseEqual(*t.tensor, got[t.name])) << t.name;
      ++compared;
    }
    EXPECT_EQ(compared, static_cast<int>(got.size()));
  }

  gpipe::v1::Schedule schedule_ = gpipe::v1::ONE_F_ONE_B;
  gpipe::v1::JobSpec spec_;
  std::filesystem::path dir_;
  Reports reports_;
  std::unique_ptr<TestWorker> a_, b_;
};

TEST_F(WorkerTest, TwoWorkersOverGrpcMatchTheReferenceBitwise) {
  RunAndCompare("job-a", 1);
  // Each stage sent one timeline per step before its progress report:
  // M forwards, M recomputes (remat always), M backwards and the optimizer,
  // wall-clock times that lie inside the step and do not overlap.
  std::map<int64_t, std::vector<int64_t>> traced;  // stage -> steps
  std::map<int64_t, int64_t> progressed;           // stage -> steps reported
  for (const auto& m : reports_.All()) {
    if (m.has_progress()) {
      ++progressed[m.progress().stage()];
      continue;
    }
    if (!m.has_trace()) continue;
    const gpipe::v1::StepTrace& t = m.trace();
    EXPECT_EQ(t.job_id(), "job-a");
    EXPECT_EQ(t.epoch(), 1);
    // Sent before this step's progress.
    EXPECT_EQ(progressed[t.stage()], t.step());
    traced[t.stage()].push_back(t.step());
    ASSERT_EQ(t.ops_size(), 3 * 4 + 1);
    EXPECT_GT(t.start_unix_ns(), int64_t{1'600'000'000} * 1'000'000'000);
    int64_t previous_end = t.start_unix_ns();
    std::map<gpipe::v1::OpTrace::Phase, int> phases;
    for (const gpipe::v1::OpTrace& op : t.ops()) {
      ++phases[op.phase()];
      EXPECT_GE(op.start_unix_ns(), previous_end);
      EXPECT_GE(op.end_unix_ns(), op.start_unix_ns());
      previous_end = op.end_unix_ns();
    }
    EXPECT_LE(previous_end, t.end_unix_ns());
    EXPECT_EQ(phases[gpipe::v1::OpTrace::FORWARD], 4);
    EXPECT_EQ(phases[gpipe::v1::OpTrace::RECOMPUTE], 4);
    EXPECT_EQ(phases[gpipe::v1::OpTrace::BACKWARD], 4);
    EXPECT_EQ(phases[gpipe::v1::OpTrace::OPTIMIZER], 1);
  }
  std::vector<int64_t> all_steps;
  for (int64_t s = 0; s < spec_.steps(); ++s) all_steps.push_back(s);
  EXPECT_EQ(traced[0], all_steps);
  EXPECT_EQ(traced[1], all_steps);
}

// Zero-bubble ZB-H1 on worker processes' executors over gRPC: the same bits,
// and each step's trace shows the split backward's two halves.
TEST_F(WorkerTest, ZeroBubbleH1OverGrpcMatchesTheReferenceBitwise) {
  schedule_ = gpipe::v1::ZERO_BUBBLE_H1;
  RunAndCompare("job-zb", 1);
  int traces = 0;
  for (const auto& m : reports_.All()) {
    if (!m.has_trace()) continue;
    ++traces;
    std::map<gpipe::v1::OpTrace::Phase, int> phases;
    for (const gpipe::v1::OpTrace& op : m.trace().ops()) ++phases[op.phase()];
    EXPECT_EQ(phases[gpipe::v1::OpTrace::FORWARD], 4);
    EXPECT_EQ(phases[gpipe::v1::OpTrace::RECOMPUTE], 4);
    EXPECT_EQ(phases[gpipe::v1::OpTrace::BACKWARD], 0);
    EXPECT_EQ(phases[gpipe::v1::OpTrace::BACKWARD_INPUT], 4);
    EXPECT_EQ(phases[gpipe::v1::OpTrace::BACKWARD_WEIGHT], 4);
  }
  EXPECT_EQ(traces, 2 * spec_.steps());
}

// Each stage reports the activation memory it held, the tensors it received
// included (the inputs it keeps for re-materialization, the gradients):
// step for step the peaks the in-process pipeline measures with the same
// assignment, whose links copy each received tensor into the receiver's
// allocator. Before, tensors a worker received were built on the link's
// reader thread and counted by no stage.
TEST_F(WorkerTest, ActivationMemoryCountsReceivedTensorsAsInProcess) {
  RunAndCompare("job-memory", 1);
  std::map<int64_t, std::map<int64_t, int64_t>> cluster;  // stage, step
  for (const auto& m : reports_.All()) {
    if (!m.has_progress()) continue;
    cluster[m.progress().stage()][m.progress().step()] =
        m.progress().peak_activation_bytes();
  }
  PipelineOptions o;
  o.stages = 2;
  o.micro_batches = 4;
  o.schedule = ScheduleKind::kOneFOneB;
  o.remat = RematMode::kAlways;
  o.balance = *PartitionJob(spec_, 2);
  auto in_process = InProcessPipeline::Create(spec_, o);
  ASSERT_TRUE(in_process.ok()) << in_process.status();
  for (int64_t step = 1; step <= spec_.steps(); ++step) {
    ASSERT_TRUE((*in_process)->Step().ok());
    for (int stage = 0; stage < 2; ++stage) {
      const int64_t want = (*in_process)->stage(stage).peak_activation_bytes();
      EXPECT_GT(want, 0);
      EXPECT_EQ(cluster[stage][step], want)
          << "stage " << stage << ", step " << step;
    }
  }
}

// With eval.every, the last stage evaluates the test split every that many
// steps (all stages take part) and reports it; each figure is bitwise what
// the reference trainer's Evaluate gives after the same steps, as
// `gpipectl train` prints it.
TEST_F(WorkerTest, PeriodicEvaluationsAreTheReferenceTrainers) {
  spec_.mutable_eval()->set_every(2);
  spec_.mutable_eval()->set_max_samples(70);
  spec_.mutable_eval()->set_batch_size(16);
  RunAndCompare("job-eval", 1);
  auto ref = ReferenceTrainer::Create(spec_, 4);
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::vector<gpipe::v1::Evaluation> want;
  for (int s = 1; s <= spec_.steps(); ++s) {
    ASSERT_TRUE((*ref)->Step().ok());
    if (s % 2 != 0) continue;
    auto e = (*ref)->Evaluate(Split::kTest, 70);
    ASSERT_TRUE(e.ok()) << e.status();
    gpipe::v1::Evaluation w;
    w.set_step(s);
    w.set_loss(e->loss);
    w.set_accuracy(e->accuracy);
    w.set_counted(e->counted);
    want.push_back(w);
  }
  std::vector<gpipe::v1::Evaluation> got;
  for (const auto& m : reports_.All()) {
    if (m.has_evaluated()) {
      EXPECT_EQ(m.evaluated().stage(), 1);
      EXPECT_EQ(m.evaluated().job_id(), "job-eval");
      got.push_back(m.evaluated().evaluation());
    }
    if (m.has_finished() && m.finished().stage() == 1)
      got.push_back(m.finished().evaluation());
  }
  // Steps 2 and 4 periodic, 6 the final one (StageFinished).
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].step(), want[i].step()) << i;
    EXPECT_EQ(got[i].loss(), want[i].loss()) << "step " << want[i].step();
    EXPECT_EQ(got[i].accuracy(), want[i].accuracy())
        << "step " << want[i].step();
    EXPECT_EQ(got[i].counted(), 70) << "step " << want[i].step();
  }
}

// Opens an Exchange to `address`, writes `frames`, and returns how the
// worker ended the stream.
grpc::Status Exchange(const std::string& address,
                      const std::vector<gpipe::v1::Frame>& frames) {
  auto channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = gpipe::v1::Stage::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  auto rw = stub->Exchange(&context);
  for (const auto& f : frames)
    if (!rw->Write(f)) break;
  rw->WritesDone();
  gpipe::v1::Frame ignored;
  while (rw->Read(&ignored)) {
  }
  return rw->Finish();
}

gpipe::v1::Frame Open(const std::string& job, int64_t epoch, int64_t from) {
  gpipe::v1::Frame f;
  f.set_kind(gpipe::v1::OPEN);
  f.set_job_id(job);
  f.set_epoch(epoch);
  f.set_from_stage(from);
  return f;
}

TEST_F(WorkerTest, BadLinksAreRejectedAndTheWorkerKeepsServing) {
  // Worker b runs stage 1 of job-b epoch 2 and waits for its upstream.
  b_->executor.Start(Assign(1, 2, "job-b"));

  grpc::Status s = Exchange(b_->address, {Open("job-other", 2, 0)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("no assignment for job job-other"),
            std::string::npos)
      << s.error_message();

  s = Exchange(b_->address, {Open("job-b", 1, 0)});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("older than this worker's epoch 2"),
            std::string::npos)
      << s.error_message();

  gpipe::v1::Frame first;
  first.set_kind(gpipe::v1::ACTIVATION);
  s = Exchange(b_->address, {first});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();

  // A header whose byte count does not match its shape.
  gpipe::v1::Frame bad;
  bad.set_job_id("job-b");
  bad.set_epoch(2);
  bad.set_kind(gpipe::v1::ACTIVATION);
  bad.mutable_header()->set_dtype(gpipe::v1::FLOAT32);
  bad.mutable_header()->mutable_shape()->add_dims(2);
  bad.mutable_header()->mutable_shape()->add_dims(3);
  bad.set_total_bytes(10);
  bad.set_payload(std::string(10, 'x'));
  bad.set_last(true);
  s = Exchange(b_->address, {Open("job-b", 2, 0), bad});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << s.error_message();
  EXPECT_NE(s.error_message().find(
                "header announces 10 bytes but shape [2, 3] needs 24"),
            std::string::npos)
      << s.error_message();
  std::string failure;
  reports_.WaitFinished(1, &failure);  // stage 1 fails: its link was bad
  EXPECT_NE(failure.find("header announces"), std::string::npos) << failure;

  // Bytes that are no Frame at all.
  {
    auto channel =
        grpc::CreateChannel(b_->address, grpc::InsecureChannelCredentials());
    grpc::GenericStub generic(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    grpc::CompletionQueue cq;
    auto call = generic.PrepareCall(&context, "/gpipe.v1.Stage/Exchange", &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    const char junk[] =
        "\xff\xff\xff\xff garbage that is not a protobuf \x01\x02";
    grpc::Slice slice(junk, sizeof(junk));
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(4));
    while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(4)) {
    }
    EXPECT_FALSE(status.ok());
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
  }

  // Both workers still serve a whole job.
  RunAndCompare("job-c", 3);
}

// Data-parallel replicas on workers over gRPC: K=2 stages x R replicas, the
// replicas of each stage summing their gradients over Exchange links of their
// own. Four gradient groups pinned in the spec: for R in 1, 2 and 4 the
// parameters are the reference trainer's bits, and so is the loss added from
// the replicas' micro-batch losses. Replica 0 alone writes the final
// parameters.
TEST_F(WorkerTest, ReplicasOverGrpcMatchTheReferenceBitwise) {
  gpipe::v1::JobSpec spec = spec_;
  spec.mutable_model()->mutable_layers()->DeleteSubrange(1, 1);  // batch norm
  constexpr int64_t kM = 4;
  spec.mutable_pipeline()->set_micro_batches(kM);
  spec.mutable_pipeline()->set_gradient_groups(4);
  const std::vector<int64_t> balance = *PartitionJob(spec, 2);
  const std::vector<int64_t> begins = StageBegins(balance);
  std::vector<double> reference_losses;
  auto ref = ReferenceTrainer::Create(spec, kM);
  ASSERT_TRUE(ref.ok()) << ref.status();
  for (int s = 0; s < spec.steps(); ++s) {
    absl::StatusOr<StepReport> r = (*ref)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    reference_losses.push_back(r->loss);
  }
  for (const int64_t replicas : {1, 2, 4}) {
    SCOPED_TRACE(testing::Message() << replicas << " replicas");
    spec.mutable_pipeline()->set_replicas(replicas);
    std::vector<std::unique_ptr<TestWorker>> workers;  // [replica * 2 + stage]
    for (int64_t i = 0; i < 2 * replicas; ++i)
      workers.push_back(std::make_unique<TestWorker>(&reports_, 3000));
    const std::string job = "job-r" + std::to_string(replicas);
    reports_.Clear();
    for (int64_t i = 2 * replicas - 1; i >= 0; --i) {
      const int64_t stage = i % 2, replica = i / 2;
      gpipe::v1::Assignment a;
      a.set_job_id(job);
      a.set_epoch(1);
      *a.mutable_spec() = spec;
      a.set_stage(stage);
      a.set_stages(2);
      a.set_layer_begin(begins[stage]);
      a.set_layer_end(begins[stage] + balance[stage]);
      a.set_micro_batches(kM);
      a.set_schedule(gpipe::v1::ONE_F_ONE_B);
      a.set_remat(gpipe::v1::ALWAYS);
      a.set_replica(replica);
      a.set_replicas(replicas);
      for (int64_t q = 0; q < replicas; ++q)
        a.add_replica_addresses(workers[q * 2 + stage]->address);
      if (stage == 0) a.set_downstream_address(workers[i + 1]->address);
      if (stage == 1) a.set_upstream_address(workers[i - 1]->address);
      a.set_output_dir((dir_ / job).string());
      workers[i]->executor.Start(a);
    }
    std::string failure;
    ASSERT_TRUE(reports_.WaitFinished(2 * replicas, &failure)) << failure;
    std::map<std::string, Tensor> got;
    // step -> micro-batch -> its loss, from whichever replica ran it.
    std::map<int64_t, std::map<int64_t, LossResult>> losses;
    std::map<int64_t, double> normalizer, single_loss;
    for (const auto& m : reports_.All()) {
      if (m.has_progress() && m.progress().stage() == 1) {
        const gpipe::v1::StepProgress& p = m.progress();
        single_loss[p.step()] = p.loss();
        if (replicas == 1) continue;
        EXPECT_EQ(p.micro_batch_losses_size(), kM / replicas);
        normalizer[p.step()] = p.loss_normalizer();
        for (const gpipe::v1::MicroBatchLoss& l : p.micro_batch_losses()) {
          LossResult r;
          r.loss_sum = l.loss_sum();
          r.correct = l.correct();
          r.counted = l.counted();
          EXPECT_TRUE(losses[p.step()].emplace(l.micro_batch(), r).second);
        }
      }
      if (!m.has_finished()) continue;
      if (m.finished().replica() != 0) {
        EXPECT_EQ(m.finished().parameters_path(), "");
        continue;
      }
      auto file = ReadSafetensors(m.finished().parameters_path());
      ASSERT_TRUE(file.ok()) << file.status();
      for (auto& [name, t] : file->tensors) got[name] = t;
    }
    for (int64_t s = 0; s < spec.steps(); ++s) {
      double loss = single_loss[s + 1];
      if (replicas > 1) {
        ASSERT_EQ(losses[s + 1].size(), static_cast<size_t>(kM));
        LossResult sum;
        for (const auto& [mb, l] : losses[s + 1]) sum += l;
        loss = sum.loss_sum / normalizer[s + 1];
      }
      EXPECT_EQ(loss, reference_losses[s]) << "step " << s;
    }
    int compared = 0;
    for (const NamedTensor& t : (*ref)->StateTensors()) {
      ASSERT_TRUE(got.count(t.name)) << t.name;
      EXPECT_TRUE(BitwiseEqual(*t.tensor, got[t.name])) << t.name;
      ++compared;
    }
    EXPECT_EQ(compared, static_cast<int>(got.size()));
  }
}

// Reduction links a replica must refuse: from a replica that is not below
// it, from another job, from an older epoch; and an assignment whose
// replicas do not divide the spec's gradient groups fails by name.
TEST_F(WorkerTest, BadReductionLinksAndReplicaAssignmentsAreRefused) {
  gpipe::v1::JobSpec spec = spec_;
  spec.mutable_model()->mutable_layers()->DeleteSubrange(1, 1);
  spec.set_steps(100000);
  spec.mutable_pipeline()->set_replicas(2);
  gpipe::v1::Assignment a;
  a.set_job_id("job-bad");
  a.set_epoch(2);
  *a.mutable_spec() = spec;
  a.set_stage(0);
  a.set_stages(1);
  a.set_layer_begin(0);
  a.set_layer_end(spec.model().layers_size());
  a.set_micro_batches(4);
  a.set_replica(1);
  a.set_replicas(2);
  a.add_replica_addresses(a_->address);
  a.add_replica_addresses(b_->address);
  b_->executor.Start(a);  // replica 1 waits for replica 0's link
  const auto open = [&](const std::string& job, int64_t epoch,
                        int64_t from_replica) {
    gpipe::v1::Frame f = Open(job, epoch, /*from=*/0);
    f.set_from_replica(from_replica);
    const grpc::Status s = Exchange(b_->address, {f});
    EXPECT_FALSE(s.ok());
    return s.error_message();
  };
  EXPECT_NE(open("job-bad", 2, 1).find("only the replicas below"),
            std::string::npos);
  EXPECT_NE(open("job-bad", 2, 3).find("only the replicas below"),
            std::string::npos);
  EXPECT_NE(open("job-bad", 1, 0).find("older than"), std::string::npos);
  EXPECT_NE(open("job-other", 2, 0).find("no assignment"), std::string::npos);
  b_->executor.CancelAll();

  // 3 replicas of the spec's 2 groups.
  reports_.Clear();
  a.set_replicas(3);
  a.set_replica(0);
  a.add_replica_addresses(a_->address);
  a_->executor.Start(a);
  std::string failure;
  EXPECT_FALSE(reports_.WaitFinished(1, &failure));
  EXPECT_NE(failure.find("3 replicas are more than gradient_groups 2"),
            std::string::npos)
      << failure;
}

// Each link's shared-memory rings fit its stage boundary: a step's
// micro-batches, each one chunk, within [1 MiB, --shm_ring_bytes].
TEST_F(WorkerTest, ShmRingsAreSizedToTheStageBoundary) {
  constexpr int64_t kMost = int64_t{32} << 20;
  gpipe::v1::Assignment a;
  *a.mutable_spec() = spec_;
  a.set_micro_batches(4);
  a.set_layer_begin(0);
  a.set_layer_end(1);  // [8 rows of 30/4, rounded up, x 16] floats: tiny
  EXPECT_EQ(ShmRingBytesFor(a, kMost), kMinShmRingBytes);
  // 4096 rows / 4 = 1024 rows x 16 floats = 64 KiB a message; 4 x 4 of
  // them need 1 MiB; 8192 rows, 2 MiB.
  a.mutable_spec()->set_batch_size(8192);
  EXPECT_EQ(ShmRingBytesFor(a, kMost), int64_t{2} << 20);
  // Eight micro-batches of the same rows each: twice the ring.
  a.set_micro_batches(8);
  a.mutable_spec()->set_batch_size(16384);
  EXPECT_EQ(ShmRingBytesFor(a, kMost), int64_t{4} << 20);
  // Far more than the flag allows: the flag.
  a.mutable_spec()->set_batch_size(int64_t{1} << 24);
  EXPECT_EQ(ShmRingBytesFor(a, kMost), kMost);
  EXPECT_EQ(ShmRingBytesFor(a, 3 * kMinShmRingBytes), 3 * kMinShmRingBytes);
  // Layers the model does not have: the flag (the stage itself refuses).
  a.set_layer_end(99);
  EXPECT_EQ(ShmRingBytesFor(a, kMost), kMost);
}

// The bytes the memory model says stage `stage` of `spec` cut in two needs
// under Assign's pipeline: what the worker checks against its budget.
int64_t ModelNeed(const gpipe::v1::JobSpec& spec, int64_t stage) {
  const ModelShapes shapes = *InferModelShapes(spec.model());
  return EstimatePipelineMemory(spec, shapes, *PartitionJob(spec, 2), 4,
                                ScheduleKind::kOneFOneB, RematMode::kAlways)
      .at(stage)
      .total();
}

// The data plane stage 0 reported, and the segment it created for it.
std::pair<std::string, int64_t> Stage0Plane(Reports& reports) {
  for (const auto& m : reports.All()) {
    if (m.has_progress() && m.progress().stage() == 0)
      return {m.progress().data_plane(), m.progress().segment_bytes()};
  }
  return {"", 0};
}

// A worker creates (and pre-faults) the shared segment of the link it
// dials, so the segment is its memory: it fits the rings in what its
// memory for stages leaves beside its stage's needs (ShmRingFitting halves
// them), down to the smallest, whose excess comes from its reserve: frames
// would copy more. Bitwise the same either way, and under a forced plane.
TEST_F(WorkerTest, TheDialersSegmentFitsItsMemoryDownToTheSmallest) {
  // Micro-batches of 2048 rows: 128 KiB messages, rings of 2 MiB.
  spec_.set_batch_size(8192);
  spec_.mutable_data()->mutable_synthetic()->set_train_samples(8192);
  gpipe::v1::Assignment first = Assign(0, 1, "job-rule");
  ASSERT_EQ(ShmRingBytesFor(first, int64_t{32} << 20), int64_t{2} << 20);
  DataPlaneOptions planes;
  planes.mode = DataPlaneMode::kAuto;
  a_->executor.set_data_plane(planes);
  b_->executor.set_data_plane(planes);
  const int64_t need = ModelNeed(spec_, 0);
  ASSERT_GT(need, 0);
  const int64_t rule = ShmSegmentBytes(int64_t{2} << 20);
  const int64_t smallest = ShmSegmentBytes(kMinShmRingBytes);
  const std::pair<int64_t, int64_t> cases[] = {
      {need + rule, rule},              // the rule's rings fit
      {need + rule - 1, smallest},      // halved until they fit
      {need + smallest - 1, smallest},  // the smallest, from the reserve
  };
  int epoch = 1;
  for (const auto& [budget, segment] : cases) {
    a_->executor.set_memory_budget(budget);
    RunAndCompare(absl::StrCat("job-budget-", budget), epoch++);
    EXPECT_EQ(Stage0Plane(reports_),
              (std::pair<std::string, int64_t>{"shm", segment}))
        << "budget " << budget << " for a need of " << need;
  }
}

TEST_F(WorkerTest, ForcedShmWithoutRoomForASegmentTakesTheSmallest) {
  DataPlaneOptions planes;
  planes.mode = DataPlaneMode::kShm;
  a_->executor.set_data_plane(planes);
  b_->executor.set_data_plane(planes);
  a_->executor.set_memory_budget(ModelNeed(spec_, 0) + kMinShmRingBytes);
  RunAndCompare("job-forced-shm", 1);
  EXPECT_EQ(Stage0Plane(reports_),
            (std::pair<std::string, int64_t>{
                "shm", ShmSegmentBytes(kMinShmRingBytes)}));
}

// A replica's worker whose epoch is cancelled keeps its stage's state for a
// resume from memory, counted, and frees it when no assignment has come for
// it within the TTL (--parked_state_seconds) or another job's comes.
TEST_F(WorkerTest, ParkedStateIsFreedWhenNothingUsesIt) {
  gpipe::v1::JobSpec spec = spec_;
  spec.mutable_model()->mutable_layers()->DeleteSubrange(1, 1);  // batch norm
  spec.set_steps(100000);
  spec.mutable_pipeline()->set_replicas(2);
  a_->executor.set_parked_state_ttl(std::chrono::milliseconds(300));
  gpipe::v1::Assignment a;
  a.set_job_id("job-park");
  a.set_epoch(1);
  *a.mutable_spec() = spec;
  a.set_stage(0);
  a.set_stages(1);
  a.set_layer_begin(0);
  a.set_layer_end(spec.model().layers_size());
  a.set_micro_batches(4);
  a.set_replicas(2);
  a.add_replica_addresses(a_->address);
  a.add_replica_addresses(b_->address);
  a.set_replica(1);
  b_->executor.Start(a);
  a.set_replica(0);
  a_->executor.Start(a);
  // Both replicas past a few steps.
  const auto deadline = absl::Now() + absl::Seconds(30);
  auto steps_of = [&](int64_t replica) {
    int64_t step = 0;
    for (const auto& m : reports_.All()) {
      if (m.has_progress() && m.progress().replica() == replica)
        step = std::max(step, m.progress().step());
    }
    return step;
  };
  while ((steps_of(0) < 3 || steps_of(1) < 3) && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(20));
  ASSERT_GE(steps_of(0), 3);
  ASSERT_GE(steps_of(1), 3);
  a_->executor.Cancel("job-park", 1);
  b_->executor.Cancel("job-park", 1);
  ASSERT_GE(a_->executor.parked_step(), 3);
  ASSERT_GE(b_->executor.parked_step(), 3);
  int parked_reports = 0;
  for (const auto& m : reports_.All()) {
    if (m.has_parked()) {
      EXPECT_GE(m.parked().step(), 3);
      ++parked_reports;
    }
  }
  EXPECT_EQ(parked_reports, 2);
  // Worker a's TTL runs out; b's (the default, two minutes) does not.
  const auto freed_by = absl::Now() + absl::Seconds(10);
  while (a_->executor.parked_step() >= 0 && absl::Now() < freed_by)
    absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(a_->executor.parked_step(), -1);
  EXPECT_GE(b_->executor.parked_step(), 3);
  // Another job's assignment frees it at once.
  reports_.Clear();
  gpipe::v1::Assignment other = a;
  other.set_job_id("job-after");
  other.mutable_spec()->set_steps(1);
  other.mutable_spec()->mutable_pipeline()->set_replicas(1);
  other.set_replicas(1);
  other.clear_replica_addresses();
  other.set_output_dir((dir_ / "job-after").string());
  b_->executor.Start(other);
  std::string failure;
  ASSERT_TRUE(reports_.WaitFinished(1, &failure)) << failure;
  EXPECT_EQ(b_->executor.parked_step(), -1);
}

}  // namespace
}  // namespace gpipe
