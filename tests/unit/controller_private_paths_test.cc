// A job may not name the controller's own files: its submit-time checks
// quote what they read, and a job naming the worker token file handed the
// token to the submitter.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "controller/private_paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"

namespace gpipe::controller {
namespace {

using ::testing::HasSubstr;

class PrivatePathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("private_paths_test-", getpid());
    std::filesystem::create_directories(dir_ / "secrets");
    std::filesystem::create_directories(dir_ / "data");
    std::ofstream(dir_ / "secrets" / "worker.token") << "0123abcd\n";
    std::ofstream(dir_ / "data" / "train.csv") << "x,label\n1,0\n";
    token_ = (dir_ / "secrets" / "worker.token").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  gpipe::v1::JobSpec Spec(const std::string& csv, const std::string& init) {
    gpipe::v1::JobSpec spec;
    spec.mutable_data()->mutable_csv()->set_path(csv);
    if (!init.empty()) spec.mutable_init_from()->set_path(init);
    return spec;
  }
  std::filesystem::path dir_;
  std::string token_;
};

TEST_F(PrivatePathsTest, TheControllersOwnFilesAreRefused) {
  const std::string data = (dir_ / "data" / "train.csv").string();
  const std::vector<std::string> secrets = {"", token_};
  EXPECT_TRUE(CheckNoPrivatePaths(Spec(data, ""), secrets).ok());
  // The file itself, by another spelling and through a link.
  const absl::Status direct = CheckNoPrivatePaths(Spec(token_, ""), secrets);
  EXPECT_TRUE(absl::IsPermissionDenied(direct)) << direct;
  EXPECT_THAT(direct.message(), HasSubstr("data.csv.path: " + token_));
  EXPECT_THAT(direct.message(), ::testing::Not(HasSubstr("0123abcd")));
  const std::string dotted =
      (dir_ / "data" / ".." / "secrets" / ".." / "secrets" / "worker.token")
          .string();
  EXPECT_TRUE(
      absl::IsPermissionDenied(CheckNoPrivatePaths(Spec(dotted, ""), secrets)));
  const std::string link = (dir_ / "data" / "innocent.csv").string();
  std::filesystem::create_symlink(token_, link);
  EXPECT_TRUE(
      absl::IsPermissionDenied(CheckNoPrivatePaths(Spec(link, ""), secrets)));
  // init_from, and a folder that holds it (a folder of weights is read
  // file by file).
  const absl::Status init =
      CheckNoPrivatePaths(Spec(data, (dir_ / "secrets").string()), secrets);
  EXPECT_TRUE(absl::IsPermissionDenied(init)) << init;
  EXPECT_THAT(init.message(), HasSubstr("init_from.path"));
  // No private files: nothing is refused.
  EXPECT_TRUE(CheckNoPrivatePaths(Spec(token_, ""), {}).ok());
}

}  // namespace
}  // namespace gpipe::controller
