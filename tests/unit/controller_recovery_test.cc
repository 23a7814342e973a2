// Checkpoint bookkeeping on real files: reports checked against the layout
// and the step plan, verified against what the stages reported when
// committed, the newest intact checkpoint chosen for a restart (corrupt
// ones dropped and counted), the last N kept and the rest handed back for
// removal off the lock, and the final parameters committed like a
// checkpoint.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "controller/recovery.h"
#include "gtest/gtest.h"
#include "services/storage/checkpoint_layout.h"
#include "services/storage/file_io.h"
#include "services/storage/manifest.h"
#include "services/storage/sha256.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ =
        std::filesystem::temp_directory_path() /
        absl::StrCat(
            "controller_recovery_test-", getpid(), "-",
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // What stage `stage` of `epoch` writes and reports for `step`.
  v1::StageCheckpointed Write(int64_t step, int64_t epoch, int64_t stage) {
    const std::string path = storage::StageFilePath(
        storage::CheckpointStepDir(
            storage::JobCheckpointDir(root_.string(), "j"), step),
        epoch, stage);
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path());
    const std::string bytes = absl::StrCat("stage ", stage, " step ", step);
    std::ofstream(path, std::ios::binary) << bytes;
    v1::StageCheckpointed r;
    r.set_job_id("j");
    r.set_epoch(epoch);
    r.set_stage(stage);
    r.set_step(step);
    r.set_path(path);
    r.set_sha256(storage::Sha256Hex(bytes));
    r.set_bytes(static_cast<int64_t>(bytes.size()));
    r.set_layer_begin(stage * 2);
    r.set_layer_end(stage * 2 + 2);
    return r;
  }
  v1::CheckpointRef Commit(int64_t step) {
    std::vector<v1::StageCheckpointed> reports = {Write(step, 1, 0),
                                                  Write(step, 1, 1)};
    EXPECT_TRUE(VerifyCheckpointReports(reports).ok());
    absl::StatusOr<v1::CheckpointRef> ref =
        CommitCheckpoint(root_.string(), "j", 1, reports);
    EXPECT_TRUE(ref.ok()) << ref.status();
    return *ref;
  }

  std::filesystem::path root_;
};

// Job folders no known job owns are found (a controller without --store
// forgot their jobs at its restart); other folders and files are not job
// folders, and a missing checkpoint folder has none.
TEST_F(RecoveryTest, JobFoldersOfNoKnownJobAreFound) {
  EXPECT_TRUE(UnknownJobDirs(root_.string(), {}).empty());
  for (const char* dir :
       {"job-0000000a", "job-0000000b", "job-0000000c", "other", "final"}) {
    std::filesystem::create_directories(root_ / dir);
  }
  std::ofstream(root_ / "job-0000000d") << "a file, not a folder";
  EXPECT_EQ(UnknownJobDirs(root_.string(), {"job-0000000b"}),
            (std::vector<std::string>{(root_ / "job-0000000a").string(),
                                      (root_ / "job-0000000c").string()}));
  EXPECT_TRUE(UnknownJobDirs(root_.string(),
                             {"job-0000000a", "job-0000000b", "job-0000000c"})
                  .empty());
}

TEST_F(RecoveryTest, ReportsMustNameTheirPlaceOnACheckpointStep) {
  const StepPlan plan(/*steps=*/10, /*checkpoint_every=*/2, /*eval_every=*/0);
  v1::StageCheckpointed r = Write(4, 1, 0);
  EXPECT_TRUE(CheckCheckpointReport(root_.string(), r, plan).ok());
  v1::StageCheckpointed odd = Write(3, 1, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckCheckpointReport(root_.string(), odd, plan)));
  v1::StageCheckpointed elsewhere = r;
  elsewhere.set_path("/etc/passwd");
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckCheckpointReport(root_.string(), elsewhere, plan)));
  v1::StageCheckpointed other_epoch = r;
  other_epoch.set_epoch(2);  // the path is of epoch 1
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckCheckpointReport(root_.string(), other_epoch, plan)));
  v1::StageCheckpointed no_digest = r;
  no_digest.clear_sha256();
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckCheckpointReport(root_.string(), no_digest, plan)));
}

TEST_F(RecoveryTest, ACommitVerifiesWhatTheStagesReported) {
  v1::StageCheckpointed good = Write(2, 1, 0);
  EXPECT_TRUE(VerifyCheckpointReports({good}).ok());
  v1::StageCheckpointed lied = good;
  lied.set_sha256(std::string(64, '0'));
  absl::Status s = VerifyCheckpointReports({lied});
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  v1::StageCheckpointed short_file = good;
  short_file.set_bytes(good.bytes() + 1);
  EXPECT_TRUE(absl::IsDataLoss(VerifyCheckpointReports({short_file})));
  std::filesystem::remove(good.path());
  EXPECT_TRUE(absl::IsDataLoss(VerifyCheckpointReports({good})));
}

TEST_F(RecoveryTest, TheNewestIntactCheckpointIsChosenAndCorruptOnesDropped) {
  v1::JobStatus status;
  for (int64_t step : {2, 4, 6}) {
    EXPECT_TRUE(KeepCheckpoints(&status, Commit(step), 3).empty());
  }
  std::vector<v1::CheckpointRef> committed(status.checkpoints().begin(),
                                           status.checkpoints().end());
  RestorePoint point = CheckRestorePoint(committed);
  ASSERT_TRUE(point.chosen.has_value());
  EXPECT_EQ(point.chosen->step(), 6);
  EXPECT_TRUE(point.unusable.empty());

  // Step 6's file flipped, step 4's manifest gone: step 2 it is.
  const std::string six = Write(6, 1, 1).path();
  std::ofstream(six, std::ios::binary) << "flipped";
  std::filesystem::remove(committed[1].manifest_path());
  point = CheckRestorePoint(committed);
  ASSERT_TRUE(point.chosen.has_value());
  EXPECT_EQ(point.chosen->step(), 2);
  ASSERT_EQ(point.unusable.size(), 2u);
  EXPECT_EQ(point.unusable[0].first.step(), 6);
  EXPECT_TRUE(absl::IsDataLoss(point.unusable[0].second))
      << point.unusable[0].second;
  EXPECT_EQ(point.unusable[1].first.step(), 4);
  EXPECT_EQ(DropUnusable("j", &status, point), 2);
  ASSERT_EQ(status.checkpoints_size(), 1);
  EXPECT_EQ(status.checkpoints(0).step(), 2);
  // Dropping again finds nothing left to drop.
  EXPECT_EQ(DropUnusable("j", &status, point), 0);
}

TEST_F(RecoveryTest, NothingIntactMeansTheBeginning) {
  v1::CheckpointRef ref = Commit(2);
  std::filesystem::remove_all(
      std::filesystem::path(ref.manifest_path()).parent_path());
  const RestorePoint point = CheckRestorePoint({ref});
  EXPECT_FALSE(point.chosen.has_value());
  EXPECT_EQ(point.unusable.size(), 1u);
}

TEST_F(RecoveryTest, KeepsTheNewestNAndHandsBackTheRestForRemoval) {
  v1::JobStatus status;
  std::vector<std::string> dropped;
  for (int64_t step : {2, 4, 6, 8}) {
    for (const std::string& d : KeepCheckpoints(&status, Commit(step), 2)) {
      dropped.push_back(d);
    }
  }
  ASSERT_EQ(status.checkpoints_size(), 2);
  EXPECT_EQ(status.checkpoints(0).step(), 6);
  EXPECT_EQ(status.checkpoints(1).step(), 8);
  ASSERT_EQ(dropped.size(), 2u);
  // Not removed yet: that is the caller's, off the lock.
  EXPECT_TRUE(std::filesystem::exists(dropped[0]));
  RemoveCheckpointDirs(dropped);
  EXPECT_FALSE(std::filesystem::exists(dropped[0]));
  EXPECT_FALSE(std::filesystem::exists(dropped[1]));
  // A replay that commits step 6 again replaces it and what came after.
  EXPECT_TRUE(KeepCheckpoints(&status, Commit(6), 2).empty());
  ASSERT_EQ(status.checkpoints_size(), 1);
  EXPECT_EQ(status.checkpoints(0).step(), 6);
}

// A full store gives up the oldest checkpoint, never the last one: the
// newest stays the restore point.
TEST_F(RecoveryTest, AFullStoreDropsTheOldestButNeverTheLast) {
  v1::JobStatus status;
  for (int64_t step : {2, 4}) KeepCheckpoints(&status, Commit(step), 3);
  std::optional<DroppedCheckpoint> dropped = DropOldestCheckpoint(&status);
  ASSERT_TRUE(dropped.has_value());
  EXPECT_EQ(dropped->step, 2);
  EXPECT_EQ(dropped->dir,
            storage::CheckpointStepDir(
                storage::JobCheckpointDir(root_.string(), "j"), 2));
  ASSERT_EQ(status.checkpoints_size(), 1);
  EXPECT_EQ(status.checkpoints(0).step(), 4);
  EXPECT_FALSE(DropOldestCheckpoint(&status).has_value());
  EXPECT_EQ(status.checkpoints_size(), 1);
}

// What a failed or killed write of an earlier epoch left goes; this
// epoch's files, anything committed and anything not ours stay.
TEST_F(RecoveryTest, StaleStageFilesOfEarlierEpochsAreRemoved) {
  Commit(2);  // e1 files, committed: stay
  const std::string job_dir = storage::JobCheckpointDir(root_.string(), "j");
  const std::filesystem::path step4 = storage::CheckpointStepDir(job_dir, 4);
  const std::filesystem::path step6 = storage::CheckpointStepDir(job_dir, 6);
  const std::filesystem::path final_dir = storage::FinalParametersDir(job_dir);
  for (const auto& dir : {step4, step6, final_dir}) {
    std::filesystem::create_directories(dir);
  }
  auto touch = [](const std::filesystem::path& p) { std::ofstream(p) << "x"; };
  touch(step4 / "e1-stage-0.safetensors");           // a failed checkpoint
  touch(step4 / "e2-stage-1.safetensors.tmp.4242");  // a killed write
  touch(step6 / "e3-stage-0.safetensors");           // this epoch's
  touch(step6 / "e1-stage-1.safetensors.tmp.77");    // a killed write
  touch(step6 / "notes.txt");                        // not ours
  touch(final_dir / "e2-stage-0.safetensors");       // a failed finish
  // At an epoch's start the files go and their directories stay (a stage of
  // the new epoch may have just made one); at the job's end those go too.
  EXPECT_EQ(RemoveStaleStageFiles(root_.string(), "j", 3,
                                  /*remove_empty_dirs=*/false),
            4);
  EXPECT_TRUE(std::filesystem::is_empty(step4));
  EXPECT_EQ(RemoveStaleStageFiles(root_.string(), "j", 3,
                                  /*remove_empty_dirs=*/true),
            0);
  EXPECT_FALSE(std::filesystem::exists(step4));  // emptied, so gone
  EXPECT_FALSE(std::filesystem::exists(final_dir));
  EXPECT_TRUE(std::filesystem::exists(step6 / "e3-stage-0.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(step6 / "notes.txt"));
  EXPECT_FALSE(
      std::filesystem::exists(step6 / "e1-stage-1.safetensors.tmp.77"));
  const std::filesystem::path step2 = storage::CheckpointStepDir(job_dir, 2);
  EXPECT_TRUE(std::filesystem::exists(step2 / "e1-stage-0.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(step2 / storage::kManifestName));
  // A job with no directory yet has nothing to remove.
  EXPECT_EQ(RemoveStaleStageFiles(root_.string(), "other", 3, true), 0);
}

// A job stored by a controller that listed its final parameters as a
// checkpoint loses that entry, and only that one, when restored.
TEST_F(RecoveryTest, FinalParametersAreNoCheckpoint) {
  v1::JobStatus status;
  for (int64_t step : {4, 6}) *status.add_checkpoints() = Commit(step);
  v1::CheckpointRef final_ref;
  final_ref.set_step(8);
  final_ref.set_manifest_path(
      (std::filesystem::path(storage::FinalParametersDir(
           storage::JobCheckpointDir(root_.string(), "j"))) /
       storage::kManifestName)
          .string());
  *status.add_checkpoints() = final_ref;
  EXPECT_FALSE(RemoveFinalParametersRefs(root_.string(), "other", &status));
  EXPECT_TRUE(RemoveFinalParametersRefs("elsewhere", "j", &status));
  ASSERT_EQ(status.checkpoints_size(), 2);
  EXPECT_EQ(status.checkpoints(1).step(), 6);
  EXPECT_FALSE(RemoveFinalParametersRefs(root_.string(), "j", &status));
}

TEST_F(RecoveryTest, FinalParametersAreCommittedWithAManifest) {
  const std::string final_dir = storage::FinalParametersDir(
      storage::JobCheckpointDir(root_.string(), "j"));
  std::filesystem::create_directories(final_dir);
  std::vector<v1::StageCheckpointed> stages(2);
  for (int i = 0; i < 2; ++i) {
    const std::string path = storage::StageFilePath(final_dir, 5, i);
    std::ofstream(path, std::ios::binary) << "final " << i;
    stages[i].set_stage(i);
    stages[i].set_layer_begin(i * 2);
    stages[i].set_layer_end(i * 2 + 2);
    stages[i].set_path(path);
  }
  absl::StatusOr<v1::CheckpointRef> ref =
      CommitFinalParameters(root_.string(), "j", 5, 10, stages);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->step(), 10);
  EXPECT_EQ(
      ref->manifest_path(),
      (std::filesystem::path(final_dir) / storage::kManifestName).string());
  absl::StatusOr<v1::CheckpointManifest> m =
      storage::ReadVerifiedManifest(ref->manifest_path());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->epoch(), 5);
  ASSERT_EQ(m->files_size(), 2);
  EXPECT_EQ(m->files(1).path(), "e5-stage-1.safetensors");
  std::filesystem::remove(stages[1].path());
  EXPECT_FALSE(CommitFinalParameters(root_.string(), "j", 5, 10, stages).ok());
}

// A commit writes the job's spec beside its manifest (JOB.json), which a
// manifest reader of any release ignores: a fetched checkpoint says what
// its ids mean. Without a spec there is none.
TEST_F(RecoveryTest, ACommitWritesTheJobsSpecBesideItsManifest) {
  const v1::CheckpointRef plain = Commit(4);
  EXPECT_FALSE(std::filesystem::exists(
      std::filesystem::path(plain.manifest_path()).parent_path() /
      storage::kJobSpecName));
  std::vector<v1::StageCheckpointed> reports = {Write(8, 1, 0), Write(8, 1, 1)};
  v1::JobSpec spec;
  spec.set_name("with-spec");
  spec.set_steps(20);
  absl::StatusOr<v1::CheckpointRef> ref =
      CommitCheckpoint(root_.string(), "j", 1, reports, spec);
  ASSERT_TRUE(ref.ok()) << ref.status();
  absl::StatusOr<std::string> json = storage::ReadWholeFile(
      (std::filesystem::path(ref->manifest_path()).parent_path() /
       storage::kJobSpecName)
          .string());
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_NE(json->find("\"name\":\"with-spec\""), std::string::npos) << *json;
  EXPECT_TRUE(storage::ReadVerifiedManifest(ref->manifest_path()).ok());
}

// A job's files are where they were written: its folder under an earlier
// --checkpoint_dir as well as under this one (a delete removed only this
// one, empty, and left 7 MB there), never a folder not named after it.
TEST_F(RecoveryTest, AJobsFilesAreFoundUnderEveryCheckpointDirItUsed) {
  const std::string old_root = (root_ / "old").string();
  const std::string new_root = (root_ / "new").string();
  v1::JobStatus status;
  status.set_model_path(
      storage::MergedModelPath(storage::JobCheckpointDir(old_root, "job-1")));
  status.add_checkpoints()->set_manifest_path(
      (std::filesystem::path(storage::CheckpointStepDir(
           storage::JobCheckpointDir(old_root, "job-1"), 10)) /
       storage::kManifestName)
          .string());
  status.add_checkpoints()->set_manifest_path(
      (std::filesystem::path(storage::CheckpointStepDir(
           storage::JobCheckpointDir(new_root, "job-1"), 20)) /
       storage::kManifestName)
          .string());
  status.add_checkpoints()->set_manifest_path(
      "/elsewhere/step-30/MANIFEST.json");
  EXPECT_EQ(
      JobFileDirs(new_root, "job-1", status),
      (std::vector<std::string>{storage::JobCheckpointDir(new_root, "job-1"),
                                storage::JobCheckpointDir(old_root, "job-1")}));
  EXPECT_EQ(
      JobFileDirs(new_root, "job-1", v1::JobStatus()),
      std::vector<std::string>{storage::JobCheckpointDir(new_root, "job-1")});
}

}  // namespace
}  // namespace gpipe::controller
