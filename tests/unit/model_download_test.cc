// What gpipectl fetch writes from a FetchModel stream: whole, checked files
// under their names, and nothing at all when the stream is cut, too long,
// corrupt or names a path outside the directory.
#include "cli/model_download.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "services/storage/sha256.h"

namespace gpipe::cli {
namespace {

namespace fs = std::filesystem;
using Stream = std::vector<gpipe::v1::FetchModelResponse>;

void AddFile(Stream& s, const std::string& name, const std::string& bytes,
             int chunk = 3) {
  gpipe::v1::FetchModelResponse m;
  m.mutable_header()->set_name(name);
  m.mutable_header()->set_bytes(static_cast<int64_t>(bytes.size()));
  s.push_back(m);
  for (size_t i = 0; i < bytes.size(); i += chunk) {
    m.set_chunk(bytes.substr(i, chunk));
    s.push_back(m);
  }
  m.set_sha256(storage::Sha256Hex(bytes));
  s.push_back(m);
}

class ModelDownloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gpipe-download-test-" + std::to_string(getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  absl::StatusOr<ReceivedFiles> ReceiveOnly(const Stream& s) {
    size_t next = 0;
    return ReceiveModelFiles(
        [&](gpipe::v1::FetchModelResponse* m) {
          if (next == s.size()) return false;
          *m = s[next++];
          return true;
        },
        dir_.string());
  }
  // Received and committed, as a stream the controller ended well.
  absl::StatusOr<std::vector<DownloadedFile>> Receive(const Stream& s) {
    absl::StatusOr<ReceivedFiles> files = ReceiveOnly(s);
    if (!files.ok()) return files.status();
    return files->Commit();
  }
  void Write(const std::string& name, const std::string& bytes) {
    fs::create_directories(dir_);
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
  }
  std::vector<std::string> Files() {
    std::vector<std::string> out;
    if (!fs::exists(dir_)) return out;
    for (const auto& e : fs::directory_iterator(dir_))
      out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  std::string Read(const std::string& name) {
    std::ifstream in(dir_ / name, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  fs::path dir_;
};

TEST_F(ModelDownloadTest, WritesEveryFileWhole) {
  Stream s;
  AddFile(s, "MANIFEST.json", "{\"step\": 10}");
  AddFile(s, "e1-stage-0.safetensors", std::string(1000, 'x'), 64);
  AddFile(s, "empty", "");
  auto files = Receive(s);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 3u);
  EXPECT_EQ((*files)[1].bytes, 1000);
  EXPECT_EQ((*files)[1].sha256, storage::Sha256Hex(std::string(1000, 'x')));
  EXPECT_EQ(Files(), (std::vector<std::string>{
                         "MANIFEST.json", "e1-stage-0.safetensors", "empty"}));
  EXPECT_EQ(Read("MANIFEST.json"), "{\"step\": 10}");
  EXPECT_EQ(Read("e1-stage-0.safetensors"), std::string(1000, 'x'));
}

TEST_F(ModelDownloadTest, ACutStreamLeavesNothing) {
  Stream s;
  AddFile(s, "MANIFEST.json", "{}");
  AddFile(s, "model.safetensors", "0123456789");
  s.resize(s.size() - 2);  // the last chunk and the digest never came
  auto files = Receive(s);
  EXPECT_TRUE(absl::IsAborted(files.status())) << files.status();
  EXPECT_TRUE(Files().empty());  // the complete first file is gone too
}

// Fetching a checkpoint again into the folder of an earlier fetch: a
// failure, or a stream the controller ended with an error after whole
// files, leaves the earlier files as they were. (They were replaced by the
// new copies as each arrived, then removed with them.)
TEST_F(ModelDownloadTest, AFailedFetchLeavesTheFilesThatWereThere) {
  Write("MANIFEST.json", "old manifest");
  Write("e1-stage-0.safetensors", "old stage 0");
  Stream s;
  AddFile(s, "MANIFEST.json", "new manifest");
  AddFile(s, "e1-stage-0.safetensors", "new stage 0");
  AddFile(s, "e1-stage-1.safetensors", "0123456789");
  Stream cut = s;
  cut.resize(cut.size() - 2);
  EXPECT_TRUE(absl::IsAborted(Receive(cut).status()));
  EXPECT_EQ(Files(), (std::vector<std::string>{"MANIFEST.json",
                                               "e1-stage-0.safetensors"}));
  EXPECT_EQ(Read("MANIFEST.json"), "old manifest");
  EXPECT_EQ(Read("e1-stage-0.safetensors"), "old stage 0");
  {
    absl::StatusOr<ReceivedFiles> whole = ReceiveOnly(s);
    ASSERT_TRUE(whole.ok()) << whole.status();
    // Not committed: the controller's status said the stream failed.
  }
  EXPECT_EQ(Read("MANIFEST.json"), "old manifest");
  EXPECT_EQ(Files().size(), 2u);
  ASSERT_TRUE(Receive(s).ok());
  EXPECT_EQ(Read("e1-stage-0.safetensors"), "new stage 0");
  EXPECT_EQ(Files().size(), 3u);
}

TEST_F(ModelDownloadTest, WrongLengthsAndDigestsAreDataLoss) {
  {
    Stream s;
    AddFile(s, "model.safetensors", "0123456789");
    s.back().set_sha256(storage::Sha256Hex("something else"));
    auto files = Receive(s);
    EXPECT_TRUE(absl::IsDataLoss(files.status())) << files.status();
    EXPECT_NE(files.status().message().find("sha256"), std::string::npos);
  }
  {
    Stream s;
    AddFile(s, "model.safetensors", "0123456789");
    s.front().mutable_header()->set_bytes(4);  // more bytes than announced
    EXPECT_TRUE(absl::IsDataLoss(Receive(s).status()));
  }
  {
    Stream s;
    AddFile(s, "model.safetensors", "0123456789");
    s.front().mutable_header()->set_bytes(20);  // fewer
    EXPECT_TRUE(absl::IsDataLoss(Receive(s).status()));
  }
  EXPECT_TRUE(Files().empty());
}

TEST_F(ModelDownloadTest, NamesMustBePlainFileNames) {
  for (const char* name : {"../escape", "/etc/passwd", "a/b", "", ".."}) {
    Stream s;
    AddFile(s, name, "x");
    auto files = Receive(s);
    EXPECT_TRUE(absl::IsInvalidArgument(files.status())) << name;
  }
  EXPECT_TRUE(Files().empty());
  EXPECT_FALSE(fs::exists(dir_.parent_path() / "escape"));
}

// A fetch that fails leaves no folder it made: none for a stream refused
// before its first file, and the one it made removed again after a bad one.
TEST_F(ModelDownloadTest, AFailedFetchMakesNoFolder) {
  EXPECT_TRUE(ReceiveOnly(Stream()).ok());
  EXPECT_FALSE(fs::exists(dir_));
  Stream s;
  AddFile(s, "model.safetensors", "0123456789");
  s.back().set_sha256(std::string(64, '0'));
  EXPECT_TRUE(absl::IsDataLoss(Receive(s).status()));
  EXPECT_FALSE(fs::exists(dir_));
  // Nor the folders above it that it made; one that was there stays, empty
  // or not.
  size_t next = 0;
  auto nested = ReceiveModelFiles(
      [&](gpipe::v1::FetchModelResponse* m) {
        if (next == s.size()) return false;
        *m = s[next++];
        return true;
      },
      (dir_ / "a" / "b" / "").string());
  EXPECT_TRUE(absl::IsDataLoss(nested.status()));
  EXPECT_FALSE(fs::exists(dir_));
  fs::create_directories(dir_);
  EXPECT_TRUE(absl::IsDataLoss(Receive(s).status()));
  EXPECT_TRUE(fs::is_directory(dir_));
}

// A destination that is a file, or under one, is named as such.
TEST_F(ModelDownloadTest, ADestinationThatIsAFileIsNamed) {
  std::ofstream(dir_.string()) << "a file";
  Stream s;
  AddFile(s, "model.safetensors", "0123456789");
  auto files = Receive(s);
  EXPECT_TRUE(absl::IsFailedPrecondition(files.status())) << files.status();
  EXPECT_NE(files.status().message().find("is not a directory"),
            std::string::npos)
      << files.status();
  fs::remove(dir_);
  fs::create_directories(dir_.parent_path());
  const fs::path under = dir_ / "sub";
  std::ofstream(dir_.string()) << "a file";
  auto nested = ReceiveModelFiles(
      [](gpipe::v1::FetchModelResponse*) { return false; }, under.string());
  EXPECT_TRUE(absl::IsFailedPrecondition(nested.status())) << nested.status();
  EXPECT_NE(nested.status().message().find("cannot create"), std::string::npos);
  fs::remove(dir_);
}

}  // namespace
}  // namespace gpipe::cli
