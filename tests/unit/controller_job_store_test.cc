// The job store: jobs round-trip through SQLite (and survive reopening),
// rows that do not parse are reported and skipped, and a file that is not a
// database is a clear error.
#include <sqlite3.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "controller/controller.h"
#include "controller/job_store.h"
#include "controller/store_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/controller_fixtures.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;
using ::testing::HasSubstr;

class JobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat(
               "job_store_test-", getpid(), "-",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "jobs.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static v1::Job MakeJob(const std::string& id, v1::JobState state) {
    v1::Job job;
    job.set_id(id);
    job.mutable_spec()->set_name(absl::StrCat("spec of ", id));
    job.mutable_spec()->set_steps(100);
    job.mutable_status()->set_state(state);
    job.mutable_status()->set_epoch(4);
    v1::CheckpointRef* ref = job.mutable_status()->add_checkpoints();
    ref->set_step(40);
    ref->set_manifest_path("/ckpt/" + id + "/step-40/MANIFEST.json");
    return job;
  }

  void Exec(const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    char* error = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error),
              SQLITE_OK)
        << (error ? error : "");
    sqlite3_free(error);
    sqlite3_close(db);
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(JobStoreTest, RoundTripsAcrossReopening) {
  {
    auto store = JobStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put(1, MakeJob("job-b", v1::RUNNING)).ok());
    ASSERT_TRUE((*store)->Put(0, MakeJob("job-a", v1::SUCCEEDED)).ok());
    v1::Job updated = MakeJob("job-b", v1::RESTARTING);
    updated.mutable_status()->set_epoch(5);
    ASSERT_TRUE((*store)->Put(1, updated).ok());  // replaces the row
  }
  auto store = JobStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<LoadedJobs> loaded = (*store)->LoadAll();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->bad.empty());
  ASSERT_EQ(loaded->jobs.size(), 2u);
  EXPECT_EQ(loaded->jobs[0].seq, 0);
  EXPECT_EQ(loaded->jobs[0].job.SerializeAsString(),
            MakeJob("job-a", v1::SUCCEEDED).SerializeAsString());
  EXPECT_EQ(loaded->jobs[1].job.status().state(), v1::RESTARTING);
  EXPECT_EQ(loaded->jobs[1].job.status().epoch(), 5);
  EXPECT_EQ(loaded->jobs[1].job.status().checkpoints(0).step(), 40);
}

TEST_F(JobStoreTest, BadRowsAreReportedAndSkipped) {
  {
    auto store = JobStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Put(0, MakeJob("job-good", v1::RUNNING)).ok());
  }
  Exec(
      "INSERT INTO jobs VALUES ('job-garbage', 1, 'RUNNING', 1, "
      "x'ffffffff0102');"
      "INSERT INTO jobs VALUES ('job-text', 2, 'RUNNING', 1, 'not a blob');");
  // A row whose blob is another job's.
  {
    const std::string other =
        MakeJob("job-other", v1::RUNNING).SerializeAsString();
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db,
                                 "INSERT INTO jobs VALUES ('job-wrong', 3, "
                                 "'RUNNING', 1, ?)",
                                 -1, &stmt, nullptr),
              SQLITE_OK);
    sqlite3_bind_blob(stmt, 1, other.data(), other.size(), SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(stmt), SQLITE_DONE);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
  }
  auto store = JobStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<LoadedJobs> loaded = (*store)->LoadAll();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->jobs.size(), 1u);
  EXPECT_EQ(loaded->jobs[0].job.id(), "job-good");
  ASSERT_EQ(loaded->bad.size(), 3u);
  EXPECT_THAT(loaded->bad[0], HasSubstr("job-garbage"));
  EXPECT_THAT(loaded->bad[1], HasSubstr("job-text"));
  EXPECT_THAT(loaded->bad[2], HasSubstr("job-other"));
}

TEST_F(JobStoreTest, FileThatIsNotADatabaseIsAnError) {
  std::ofstream(path_) << "this is not an SQLite database, just text that is "
                          "long enough to fill a header page............";
  auto store = JobStore::Open(path_);
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(store.status().message(), HasSubstr(path_));
  auto missing_dir =
      JobStore::Open((dir_ / "no" / "such" / "jobs.db").string());
  ASSERT_FALSE(missing_dir.ok());
  EXPECT_THAT(missing_dir.status().message(), HasSubstr("no/such"));
}

// A store is one controller's: a second is refused naming the holder,
// and once the first has closed it, the store opens again.
TEST_F(JobStoreTest, ASecondControllerOnTheStoreIsRefused) {
  auto first = JobStore::Open(path_);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = JobStore::Open(path_, absl::Milliseconds(100));
  ASSERT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("in use by another gpipe-controller (pid ",
                                     getpid(), " on ", host, " holds ", path_,
                                     ".lock)")));
  first->reset();
  auto again = JobStore::Open(path_, absl::ZeroDuration());
  EXPECT_TRUE(again.ok()) << again.status();
}

// A job the store cannot record (a full disk; here a file size limit) is
// refused at submit and not kept: acknowledged, a restart of the
// controller would have lost it without a word.
TEST_F(JobStoreTest, ASubmitTheStoreCannotRecordIsRefused) {
  ControllerOptions o;
  o.store_path = path_;
  o.checkpoint_dir = (dir_ / "ckpt").string();
  auto controller = std::make_unique<Controller>(o);
  ASSERT_TRUE(controller->Recover().ok());
  struct rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = before;
  small.rlim_cur = 512;  // no journal or log of a write fits
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::StatusOr<v1::Job> job =
      controller->SubmitJob(test_support::RecoverableSpec(1, 2));
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &before), 0);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_TRUE(absl::IsResourceExhausted(job.status())) << job.status();
  EXPECT_THAT(job.status().message(),
              HasSubstr("job store could not record the job"));
  absl::StatusOr<v1::ListJobsResponse> jobs =
      controller->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->jobs_size(), 0);
  // With room again, a submit is stored as before.
  EXPECT_TRUE(controller->SubmitJob(test_support::RecoverableSpec(1, 2)).ok());
}

// A write the store refuses (a full disk; here a file size limit) is tried
// again once there is room: a job's last change written while the disk was
// full (SUCCEEDED) was lost for good, and a restarted controller ran the
// job again. Each failure is counted (the metric).
TEST_F(JobStoreTest, AFailedWriteIsTriedAgainOnceThereIsRoom) {
  auto store = JobStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  std::atomic<int> failures{0};
  auto writer = std::make_unique<StoreWriter>(
      store->get(), [&] { ++failures; }, absl::Milliseconds(50));
  v1::Job job;
  job.set_id("job-1");
  job.mutable_status()->set_state(v1::RUNNING);
  writer->WaitWritten(writer->Put(1, job));

  struct rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = before;
  small.rlim_cur = 512;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  job.mutable_status()->set_state(v1::SUCCEEDED);
  const absl::Status full = writer->WaitStored(writer->Put(1, job), "job-1");
  // Still full at the next try or two.
  absl::SleepFor(absl::Milliseconds(120));
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &before), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_FALSE(full.ok());
  EXPECT_GE(failures.load(), 2);
  // With room again, the retry writes it without another change.
  for (int i = 0; i < 100 && !writer->WaitStored(0, "job-1").ok(); ++i)
    absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(writer->WaitStored(0, "job-1").ok());
  writer.reset();
  store->reset();
  auto reopened = JobStore::Open(path_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  absl::StatusOr<LoadedJobs> loaded = (*reopened)->LoadAll();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->jobs.size(), 1u);
  EXPECT_EQ(loaded->jobs[0].job.status().state(), v1::SUCCEEDED);
}

}  // namespace
}  // namespace gpipe::controller
