// Checkpoint manifests: SHA-256 against published vectors, atomic commit
// (a failed write leaves the old manifest and no temporary file), and every
// kind of damage to a manifest or a checkpoint file detected as DataLoss.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/storage/file_io.h"
#include "services/storage/manifest.h"
#include "services/storage/safetensors_header.h"
#include "services/storage/sha256.h"

namespace gpipe::storage {
namespace {

namespace v1 = gpipe::v1;
using ::testing::HasSubstr;
using ::testing::Not;

// A directory a service cannot write is refused at its start, naming the
// directory and the reason; a writable one is left as it was.
TEST(CheckWritableDirectory, NamesWhatCannotBeWritten) {
  const std::filesystem::path root = std::filesystem::temp_directory_path() /
                                     absl::StrCat("writable_test-", getpid());
  std::filesystem::remove_all(root);
  const std::filesystem::path made = root / "a" / "b";
  ASSERT_TRUE(CheckWritableDirectory(made.string()).ok());
  EXPECT_TRUE(std::filesystem::is_empty(made));  // the probe went
  std::ofstream(root / "file") << "x";
  absl::Status under_file =
      CheckWritableDirectory((root / "file" / "d").string());
  EXPECT_TRUE(absl::IsFailedPrecondition(under_file)) << under_file;
  EXPECT_THAT(under_file.message(), HasSubstr((root / "file" / "d").string()));
  // Read-only even for root: a read-only mount where one can be made.
  const std::filesystem::path ro = root / "ro";
  std::filesystem::create_directories(ro);
  if (geteuid() == 0 &&
      std::system(absl::StrCat("mount -t tmpfs -o size=64k,ro none ",
                               ro.string(), " 2>/dev/null")
                      .c_str()) == 0) {
    absl::Status refused = CheckWritableDirectory(ro.string());
    std::system(absl::StrCat("umount ", ro.string()).c_str());
    EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("Read-only file system"));
  }
  std::filesystem::remove_all(root);
}

// A file that cannot be made is named as asked for, not by the temporary
// name it is first written under.
TEST(WriteFileAtomically, NamesTheFileAskedFor) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            absl::StrCat("no-such-dir-", getpid()) / "t.json")
                               .string();
  absl::Status s = WriteFileAtomically(path, "{}");
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("cannot create ", path, ":")));
  EXPECT_THAT(s.message(), Not(HasSubstr(".tmp.")));
}

TEST(Sha256, MatchesPublishedVectors) {
  // FIPS 180-2 examples.
  EXPECT_EQ(Sha256Hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(
      Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat(
               "manifest_test-", getpid(), "-",
               ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // A manifest of two stage files with their true digests.
  v1::CheckpointManifest TwoFiles() {
    v1::CheckpointManifest m;
    m.set_job_id("job-1");
    m.set_step(20);
    m.set_epoch(3);
    for (int stage = 0; stage < 2; ++stage) {
      const std::string bytes = absl::StrCat("stage ", stage, " tensors");
      const std::string name = absl::StrCat("e3-stage-", stage, ".safetensors");
      Write(name, bytes);
      v1::CheckpointFile* f = m.add_files();
      f->set_path(name);
      f->set_sha256(Sha256Hex(bytes));
      f->set_bytes(bytes.size());
      f->set_stage(stage);
      f->set_layer_begin(stage * 2);
      f->set_layer_end(stage * 2 + 2);
    }
    return m;
  }

  std::string ManifestPath() { return (dir_ / kManifestName).string(); }

  std::filesystem::path dir_;
};

TEST_F(ManifestTest, RoundTripsAndVerifies) {
  const v1::CheckpointManifest m = TwoFiles();
  ASSERT_TRUE(WriteManifest(ManifestPath(), m).ok());
  absl::StatusOr<v1::CheckpointManifest> read =
      ReadVerifiedManifest(ManifestPath());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), m.SerializeAsString());
  EXPECT_EQ(Sha256File((dir_ / "e3-stage-1.safetensors").string()).value(),
            Sha256Hex("stage 1 tensors"));
}

TEST_F(ManifestTest, CommitIsAtomicAndLeavesNoTemporaryFile) {
  v1::CheckpointManifest first = TwoFiles();
  ASSERT_TRUE(WriteManifest(ManifestPath(), first).ok());
  v1::CheckpointManifest second = first;
  second.set_step(30);
  ASSERT_TRUE(WriteManifest(ManifestPath(), second).ok());
  EXPECT_EQ(ReadManifest(ManifestPath())->step(), 30);
  // A commit that cannot happen (its directory is a file) changes nothing.
  Write("blocker", "x");
  EXPECT_FALSE(
      WriteManifest((dir_ / "blocker" / kManifestName).string(), first).ok());
  EXPECT_EQ(ReadManifest(ManifestPath())->step(), 30);
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    EXPECT_THAT(entry.path().filename().string(),
                ::testing::Not(HasSubstr(".tmp")));
  }
}

TEST_F(ManifestTest, CorruptOrTruncatedFileIsDataLoss) {
  const v1::CheckpointManifest m = TwoFiles();
  ASSERT_TRUE(WriteManifest(ManifestPath(), m).ok());
  // One flipped byte: same size, other digest.
  Write("e3-stage-1.safetensors", "stage 1 tensorz");
  absl::StatusOr<v1::CheckpointManifest> read =
      ReadVerifiedManifest(ManifestPath());
  EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr("e3-stage-1.safetensors"));
  EXPECT_THAT(read.status().message(), HasSubstr("sha256"));
  // Truncated.
  Write("e3-stage-1.safetensors", "stage 1");
  read = ReadVerifiedManifest(ManifestPath());
  EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
  EXPECT_THAT(read.status().message(), HasSubstr("bytes"));
  // Missing.
  std::filesystem::remove(dir_ / "e3-stage-1.safetensors");
  read = ReadVerifiedManifest(ManifestPath());
  EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
}

// A stage file of another checkpoint put in place of this one's, with the
// manifest's digest made to match: its own step gives it away.
TEST_F(ManifestTest, AFileOfAnotherStepIsDataLoss) {
  v1::CheckpointManifest m = TwoFiles();
  for (int64_t step : {20, 10}) {
    SafetensorsHeader header;
    header.metadata["step"] = absl::StrCat(step);
    const std::string bytes = EncodeSafetensorsHeader(header);
    Write("e3-stage-0.safetensors", bytes);
    m.mutable_files(0)->set_sha256(Sha256Hex(bytes));
    m.mutable_files(0)->set_bytes(bytes.size());
    ASSERT_TRUE(WriteManifest(ManifestPath(), m).ok());
    absl::StatusOr<v1::CheckpointManifest> read =
        ReadVerifiedManifest(ManifestPath());
    if (step == 20) {
      EXPECT_TRUE(read.ok()) << read.status();
      continue;
    }
    EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
    EXPECT_THAT(read.status().message(),
                HasSubstr("e3-stage-0.safetensors is of step 10, its "
                          "manifest's is 20"));
  }
}

TEST_F(ManifestTest, MalformedManifestsAreDataLoss) {
  const v1::CheckpointManifest m = TwoFiles();
  v1::CheckpointManifest escaping = m;
  escaping.mutable_files(0)->set_path("../../etc/passwd");
  v1::CheckpointManifest absolute = m;
  absolute.mutable_files(0)->set_path("/etc/passwd");
  v1::CheckpointManifest bad_digest = m;
  bad_digest.mutable_files(1)->set_sha256("not hex");
  v1::CheckpointManifest empty = m;
  empty.clear_files();
  const std::pair<v1::CheckpointManifest, std::string> cases[] = {
      {escaping, "not a plain path"},
      {absolute, "not a plain path"},
      {bad_digest, "sha256"},
      {empty, "no files"},
  };
  for (const auto& [manifest, says] : cases) {
    ASSERT_TRUE(WriteManifest(ManifestPath(), manifest).ok());
    absl::StatusOr<v1::CheckpointManifest> read = ReadManifest(ManifestPath());
    EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
    EXPECT_THAT(read.status().message(), HasSubstr(says));
  }
  for (const std::string garbage :
       {std::string("{\"step\": "), std::string("\x00\x01\x02", 3),
        std::string("{\"no_such_field\": 1}")}) {
    Write(kManifestName, garbage);
    absl::StatusOr<v1::CheckpointManifest> read = ReadManifest(ManifestPath());
    EXPECT_TRUE(absl::IsDataLoss(read.status())) << read.status();
    EXPECT_THAT(read.status().message(), HasSubstr(kManifestName));
  }
  EXPECT_TRUE(absl::IsNotFound(
      ReadManifest((dir_ / "none" / kManifestName).string()).status()));
}

}  // namespace
}  // namespace gpipe::storage
