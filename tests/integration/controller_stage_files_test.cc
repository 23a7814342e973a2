// Stage files through the controller (CHECKPOINT_TRANSPORT_CONTROLLER) over
// real gRPC on loopback: a real stage's checkpoint uploaded by the worker's
// ControllerFileStore, committed, and restored bitwise by a stage of the
// next epoch; final parameters uploaded and merged; and every way an upload
// or a fetch can go wrong refused without a file left behind.
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "controller/controller_server.h"
#include "controller/recovery.h"
#include "controller/stage_file_transfers.h"
#include "gmock/gmock.h"
#include "gpipe/v1/controller.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/stage.h"
#include "services/storage/sha256.h"
#include "tests/support/controller_fixtures.h"
#include "tests/support/fake_worker.h"
#include "worker/controller_file_store.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;
using test_support::FakeWorker;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);

// Every file under `dir`, relative.
std::vector<std::string> Files(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, error);
       !error && it != std::filesystem::recursive_directory_iterator();
       it.increment(error)) {
    if (it->is_regular_file()) {
      out.push_back(std::filesystem::relative(it->path(), dir).string());
    }
  }
  return out;
}

class StageFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("stage_files_test-", getpid(), "-", info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ / "checkpoints");
  }
  void TearDown() override {
    stub_.reset();
    server_.reset();
    if (mounted_) umount2((dir_ / "checkpoints").c_str(), MNT_DETACH);
    std::filesystem::remove_all(dir_);
  }

  void StartController() {
    ControllerServerOptions options;
    options.listen = "127.0.0.1:0";
    options.controller.checkpoint_dir = (dir_ / "checkpoints").string();
    options.controller.heartbeat_interval = absl::Milliseconds(100);
    auto server = ControllerServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(server_->address(),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Controller::NewStub(channel_);
  }

  std::unique_ptr<FakeWorker> Attach(const std::string& id,
                                     const std::string& address) {
    auto worker = std::make_unique<FakeWorker>(*stub_, id, address);
    worker->Attach();
    return worker;
  }

  v1::Job Submit(const v1::JobSpec& spec) {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::Job job;
    const grpc::Status s = stub_->SubmitJob(&context, request, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job;
  }

  v1::Job WaitForJob(const std::string& id,
                     const std::function<bool(const v1::Job&)>& done) {
    const absl::Time deadline = absl::Now() + kWait;
    v1::Job job;
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      v1::GetJobRequest request;
      request.set_job_id(id);
      EXPECT_TRUE(stub_->GetJob(&context, request, &job).ok());
      if (done(job)) return job;
      absl::SleepFor(absl::Milliseconds(10));
    }
    ADD_FAILURE() << "timed out: " << job.status().DebugString();
    return job;
  }

  // A real stage for the assignment (alone: no links needed for files).
  std::unique_ptr<Stage> MakeStage(const v1::Assignment& a) {
    auto dataset = OpenJobDataset(a.spec());
    EXPECT_TRUE(dataset.ok()) << dataset.status();
    if (!dataset.ok()) return nullptr;
    dataset_ = std::move(*dataset);
    StagePlacement p;
    p.index = a.stage();
    p.count = a.stages();
    p.layer_begin = a.layer_begin();
    p.layer_end = a.layer_end();
    p.micro_batches = a.micro_batches();
    auto stage = Stage::Create(a.spec(), p, dataset_, nullptr, nullptr);
    EXPECT_TRUE(stage.ok()) << stage.status();
    return stage.ok() ? std::move(*stage) : nullptr;
  }

  static void Scribble(Stage& stage, float base) {
    std::vector<NamedTensor> all = stage.model().StateTensors();
    for (const NamedTensor& t : stage.optimizer().State()) all.push_back(t);
    for (const NamedTensor& t : all) {
      float* v = t.tensor->f32();
      for (int64_t i = 0; i < t.tensor->numel(); ++i) v[i] = base + 0.5f * i;
      base += 1000;
    }
  }
  static std::map<std::string, std::vector<float>> State(Stage& stage) {
    std::map<std::string, std::vector<float>> out;
    for (const NamedTensor& t : stage.model().StateTensors())
      out[t.name] = t.tensor->ToVector();
    for (const NamedTensor& t : stage.optimizer().State())
      out[t.name] = t.tensor->ToVector();
    return out;
  }

  // An upload by hand: header, then `chunks`, then `sha256` (none when
  // empty); `cancel` breaks the call after the chunks instead.
  grpc::Status RawUpload(const v1::StageFileHeader& header,
                         const std::vector<std::string>& chunks,
                         const std::string& sha256, bool cancel = false) {
    grpc::ClientContext context;
    v1::UploadStageFileResponse response;
    auto writer = stub_->UploadStageFile(&context, &response);
    v1::UploadStageFileRequest m;
    *m.mutable_header() = header;
    writer->Write(m);
    for (const std::string& c : chunks) {
      m.set_chunk(c);
      writer->Write(m);
    }
    if (cancel) {
      context.TryCancel();
      return writer->Finish();
    }
    if (!sha256.empty()) {
      m.set_sha256(sha256);
      writer->Write(m);
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // A one-stage job through the controller, running on one fake worker.
  v1::Assignment StartJob() {
    StartController();
    worker_ = Attach("w1", "127.0.0.1:9101");
    v1::JobSpec spec = test_support::RecoverableSpec(1, 3);
    spec.mutable_data()->mutable_synthetic()->set_test_samples(64);
    job_ = Submit(spec);
    std::optional<v1::ControllerMessage> m = worker_->Next();
    EXPECT_TRUE(m.has_value() && m->has_assignment());
    return m.has_value() ? m->assignment() : v1::Assignment();
  }

  std::filesystem::path dir_;
  std::unique_ptr<ControllerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Controller::Stub> stub_;
  std::unique_ptr<FakeWorker> worker_;
  v1::Job job_;
  std::shared_ptr<const Dataset> dataset_;
  bool mounted_ = false;
};

// The whole round: the assignment names no path; a checkpoint uploads,
// commits, and a stage of the next epoch fetches it back bitwise; the final
// parameters upload and the job succeeds with its merged model.
TEST_F(StageFilesTest, CheckpointUploadsCommitsAndRestoresBitwise) {
  const v1::Assignment a = StartJob();
  EXPECT_EQ(a.checkpoint_transport(), v1::CHECKPOINT_TRANSPORT_CONTROLLER);
  EXPECT_EQ(a.checkpoint_dir(), "");
  EXPECT_EQ(a.output_dir(), "");
  EXPECT_EQ(a.restore_step(), 0);
  ASSERT_FALSE(a.stream_key().empty());

  std::unique_ptr<Stage> stage = MakeStage(a);
  ASSERT_NE(stage, nullptr);
  Scribble(*stage, 1.25f);
  ControllerFileStore files(channel_, {});
  absl::StatusOr<StageFileStore::Stored> stored =
      files.SaveCheckpoint(a, *stage, 2);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->path,
            CheckpointFilePath(server_->controller().options().checkpoint_dir,
                               a.job_id(), 2, a.epoch(), 0));
  EXPECT_EQ(storage::Sha256File(stored->path).value(), stored->sha256);
  ASSERT_TRUE(worker_->Progress(a, 2));  // as a stage reports before it
  ASSERT_TRUE(worker_->Send(CheckpointedReport(a, 2, *stored)));
  WaitForJob(a.job_id(), [](const v1::Job& j) {
    return j.status().checkpoints_size() == 1;
  });

  // The worker dies; the next epoch restores step 2 through the API.
  worker_->Break();
  WaitForJob(a.job_id(), [](const v1::Job& j) {
    return j.status().state() == v1::RESTARTING;
  });
  std::unique_ptr<FakeWorker> second = Attach("w2", "127.0.0.1:9102");
  std::optional<v1::ControllerMessage> m = second->Next(kWait);
  ASSERT_TRUE(m.has_value() && m->has_assignment());
  const v1::Assignment b = m->assignment();
  EXPECT_EQ(b.restore_step(), 2);
  EXPECT_EQ(b.restore_manifest(), "");
  EXPECT_NE(b.stream_key(), a.stream_key());
  std::unique_ptr<Stage> restored = MakeStage(b);
  ASSERT_NE(restored, nullptr);
  Scribble(*restored, -7.0f);
  absl::StatusOr<int64_t> step = files.Restore(b, *restored);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 2);
  EXPECT_EQ(State(*restored), State(*stage));

  // A layer range no stage has is refused, not answered with the manifest.
  {
    v1::FetchCheckpointRequest inverted;
    inverted.set_job_id(b.job_id());
    inverted.set_epoch(b.epoch());
    inverted.set_stage(0);
    inverted.set_stream_key(b.stream_key());
    inverted.set_step(2);
    inverted.set_layer_begin(b.layer_end());
    inverted.set_layer_end(b.layer_begin());
    grpc::ClientContext context;
    auto reader = stub_->FetchCheckpoint(&context, inverted);
    v1::FetchCheckpointResponse response;
    EXPECT_FALSE(reader->Read(&response));
    const grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("are no stage's"));
  }

  // The old epoch's key fetches nothing any more.
  v1::Assignment stale = b;
  stale.set_stream_key(a.stream_key());
  EXPECT_TRUE(
      absl::IsPermissionDenied(files.Restore(stale, *restored).status()));

  // Final parameters, then the merged model.
  absl::StatusOr<StageFileStore::Stored> final = files.SaveFinal(b, *restored);
  ASSERT_TRUE(final.ok()) << final.status();
  v1::WorkerMessage finished;
  finished.mutable_finished()->set_job_id(b.job_id());
  finished.mutable_finished()->set_epoch(b.epoch());
  finished.mutable_finished()->set_stage(0);
  finished.mutable_finished()->set_parameters_path(final->path);
  ASSERT_TRUE(second->Send(finished));
  const v1::Job done = WaitForJob(b.job_id(), [](const v1::Job& j) {
    return j.status().state() == v1::SUCCEEDED ||
           j.status().state() == v1::FAILED;
  });
  EXPECT_EQ(done.status().state(), v1::SUCCEEDED) << done.DebugString();
  EXPECT_TRUE(std::filesystem::exists(done.status().model_path()));
  // The final parameters are the model, not a checkpoint: step 2 is still
  // the one kept (they hold no optimizer state to continue from).
  ASSERT_EQ(done.status().checkpoints_size(), 1) << done.DebugString();
  EXPECT_EQ(done.status().checkpoints(0).step(), 2);
}

// Whoever lacks the epoch's key, or asks for what is not a checkpoint of
// the running epoch, uploads nothing.
TEST_F(StageFilesTest, UploadsAreCheckedBeforeAByteIsWritten) {
  const v1::Assignment a = StartJob();
  v1::StageFileHeader h = UploadHeader(a, 2, /*final=*/false, 4);
  const std::string sha = storage::Sha256Hex("abcd");

  v1::StageFileHeader wrong_key = h;
  wrong_key.set_stream_key(std::string(64, '0'));
  EXPECT_EQ(RawUpload(wrong_key, {"abcd"}, sha).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::StageFileHeader no_key = h;
  no_key.clear_stream_key();
  EXPECT_EQ(RawUpload(no_key, {"abcd"}, sha).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::StageFileHeader old_epoch = h;
  old_epoch.set_epoch(a.epoch() - 1);
  EXPECT_EQ(RawUpload(old_epoch, {"abcd"}, sha).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::StageFileHeader not_a_checkpoint = h;
  not_a_checkpoint.set_step(3);
  const grpc::Status s = RawUpload(not_a_checkpoint, {"abcd"}, sha);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("not a checkpoint step"));
  v1::StageFileHeader other_stage = h;
  other_stage.set_stage(1);
  EXPECT_EQ(RawUpload(other_stage, {"abcd"}, sha).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  v1::StageFileHeader other_job = h;
  other_job.set_job_id("job-00000000");
  EXPECT_EQ(RawUpload(other_job, {"abcd"}, sha).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::StageFileHeader empty = h;
  empty.set_bytes(0);
  EXPECT_EQ(RawUpload(empty, {}, sha).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(Files(dir_ / "checkpoints"), ::testing::IsEmpty());

  // A good one, for contrast.
  EXPECT_TRUE(RawUpload(h, {"ab", "cd"}, sha).ok());
  EXPECT_EQ(Files(dir_ / "checkpoints").size(), 1u);
}

// An upload that is cut, short, long or corrupt leaves no file: not under
// its name, not as a temporary file.
TEST_F(StageFilesTest, ABrokenUploadLeavesNothingBehind) {
  const v1::Assignment a = StartJob();
  v1::StageFileHeader h = UploadHeader(a, 4, /*final=*/false, 8);
  const std::string sha = storage::Sha256Hex("abcdefgh");

  grpc::Status s = RawUpload(h, {"abcd"}, "", /*cancel=*/true);
  EXPECT_FALSE(s.ok());
  // The cancelled call's handler may still hold the file's one upload
  // slot for a moment (ABORTED "already under way"): wait it out.
  const absl::Time slot_deadline = absl::Now() + kWait;
  for (;;) {
    s = RawUpload(h, {"abcd"}, "");  // ends without its digest
    if (s.error_message().find("already under way") == std::string::npos ||
        absl::Now() >= slot_deadline) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
  s = RawUpload(h, {"abcd"}, storage::Sha256Hex("abcd"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  s = RawUpload(h, {"abcdefgh", "ij"}, sha);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("more than the 8 bytes"));
  s = RawUpload(h, {"abcdefgX"}, sha);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS);
  // The handler of the cancelled call may still be unwinding.
  const absl::Time deadline = absl::Now() + kWait;
  while (!Files(dir_ / "checkpoints").empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(Files(dir_ / "checkpoints"), ::testing::IsEmpty());
}

// A fetch needs the running epoch's key and a checkpoint the job keeps.
TEST_F(StageFilesTest, FetchesAreChecked) {
  const v1::Assignment a = StartJob();
  std::unique_ptr<Stage> stage = MakeStage(a);
  ASSERT_NE(stage, nullptr);
  ControllerFileStore files(channel_, {});
  v1::Assignment b = a;
  b.set_restore_step(2);
  absl::Status s = files.Restore(b, *stage).status();
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("no checkpoint of step 2"));
  b.set_stream_key(std::string(64, 'f'));
  EXPECT_TRUE(absl::IsPermissionDenied(files.Restore(b, *stage).status()));
}

// A full disk on the controller is a clear error naming it, and the next
// upload works once there is room.
TEST_F(StageFilesTest, AFullControllerDiskIsResourceExhausted) {
  if (mount("tmpfs", (dir_ / "checkpoints").c_str(), "tmpfs", 0, "size=64k") !=
      0) {
    GTEST_SKIP() << "cannot mount a small tmpfs here (needs root)";
  }
  mounted_ = true;
  const v1::Assignment a = StartJob();
  const std::string big(256 << 10, 'x');
  v1::StageFileHeader h =
      UploadHeader(a, 2, /*final=*/false, static_cast<int64_t>(big.size()));
  const grpc::Status s = RawUpload(h, {big}, storage::Sha256Hex(big));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("checkpoint store"));
  EXPECT_THAT(Files(dir_ / "checkpoints"), ::testing::IsEmpty());
  h.set_bytes(4);
  EXPECT_TRUE(RawUpload(h, {"abcd"}, storage::Sha256Hex("abcd")).ok());
}

// Transfers beyond the limit wait for a slot, and are refused once they
// waited too long: the controller's buffers stay bounded.
TEST(StageFileTransfersTest, ConcurrentTransfersAreBounded) {
  TransferOptions options;
  options.max_concurrent = 1;
  options.slot_wait = absl::Milliseconds(100);
  StageFileTransfers transfers(options);
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      absl::StrCat("transfers_test-", getpid());
  std::filesystem::remove_all(dir);
  absl::Notification first_holds, release;
  std::thread first([&] {
    bool header_sent = false;
    transfers
        .Receive(
            [&](v1::UploadStageFileRequest* m) {
              if (!header_sent) {
                header_sent = true;
                m->mutable_header()->set_bytes(1);
                return true;
              }
              first_holds.Notify();
              release.WaitForNotification();
              return false;
            },
            [&](const v1::StageFileHeader&) -> absl::StatusOr<std::string> {
              return (dir / "a").string();
            })
        .IgnoreError();
  });
  first_holds.WaitForNotification();
  EXPECT_EQ(transfers.active(), 1);
  bool header_sent = false;
  absl::StatusOr<v1::UploadStageFileResponse> second = transfers.Receive(
      [&](v1::UploadStageFileRequest* m) {
        if (header_sent) return false;
        header_sent = true;
        m->mutable_header()->set_bytes(1);
        return true;
      },
      [&](const v1::StageFileHeader&) -> absl::StatusOr<std::string> {
        return (dir / "b").string();
      });
  EXPECT_TRUE(absl::IsResourceExhausted(second.status())) << second.status();
  release.Notify();
  first.join();
  EXPECT_EQ(transfers.active(), 0);
  EXPECT_THAT(Files(dir), ::testing::IsEmpty());
  std::filesystem::remove_all(dir);
}

// A worker listening on every interface without --advertise is registered
// at the address its Attach came from, never 0.0.0.0.
TEST_F(StageFilesTest, AWildcardAddressBecomesThePeersIp) {
  StartController();
  std::unique_ptr<FakeWorker> w = Attach("w-any", "0.0.0.0:7171");
  EXPECT_EQ(w->welcome().address(), "127.0.0.1:7171");
  std::unique_ptr<FakeWorker> v6 = Attach("w-any6", "[::]:7172");
  EXPECT_EQ(v6->welcome().address(), "127.0.0.1:7172");
  std::unique_ptr<FakeWorker> named = Attach("w-named", "worker-3:7173");
  EXPECT_EQ(named->welcome().address(), "worker-3:7173");
  grpc::ClientContext context;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(
      stub_->ListWorkers(&context, v1::ListWorkersRequest(), &workers).ok());
  for (const v1::WorkerInfo& info : workers.workers()) {
    EXPECT_FALSE(absl::StartsWith(info.address(), "0.0.0.0")) << info.address();
  }
}

}  // namespace
}  // namespace gpipe::controller
