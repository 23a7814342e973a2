#include "services/core/cores.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace gpipe {
namespace {

TEST(CoresTest, CgroupV2QuotaRoundsUpToWholeCores) {
  EXPECT_EQ(CoresFromCpuMax("200000 100000\n"), 2);
  EXPECT_EQ(CoresFromCpuMax("150000 100000"), 2);
  EXPECT_EQ(CoresFromCpuMax("50000 100000"), 1);
  EXPECT_EQ(CoresFromCpuMax("max 100000\n"), std::nullopt);
}

TEST(CoresTest, CgroupV1QuotaOfMinusOneIsNoQuota) {
  EXPECT_EQ(CoresFromCfsQuota("400000\n", "100000\n"), 4);
  EXPECT_EQ(CoresFromCfsQuota("-1\n", "100000\n"), std::nullopt);
}

TEST(CoresTest, TextThatIsNotAQuotaIsIgnored) {
  for (const char* text : {"", "max", "100000", "a b", "100000 0", "0 100000",
                           "100000 100000 7", "-5 100000"}) {
    EXPECT_EQ(CoresFromCpuMax(text), std::nullopt) << "'" << text << "'";
  }
  EXPECT_EQ(CoresFromCfsQuota("", ""), std::nullopt);
  EXPECT_EQ(CoresFromCfsQuota("1000", "x"), std::nullopt);
}

// A cgroup filesystem laid out under a temporary directory.
class CgroupTree {
 public:
  CgroupTree()
      : root_(std::filesystem::temp_directory_path() /
              ("gpipe-cores-test-" + std::to_string(getpid()))) {
    std::filesystem::create_directories(root_);
  }
  ~CgroupTree() { std::filesystem::remove_all(root_); }
  void Write(const std::string& relative, const std::string& text) {
    const std::filesystem::path p = root_ / relative;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string root() const { return root_.string(); }

 private:
  std::filesystem::path root_;
};

TEST(CoresTest, TheTightestQuotaFromTheProcessCgroupUpIsTaken) {
  CgroupTree tree;
  tree.Write("cpu.max", "max 100000\n");
  tree.Write("slice/cpu.max", "300000 100000\n");  // a parent's limit
  tree.Write("slice/pod/cpu.max", "max 100000\n");
  EXPECT_EQ(QuotaCores("0::/slice/pod\n", tree.root()), 3);
  tree.Write("slice/pod/cpu.max", "150000 100000\n");
  EXPECT_EQ(QuotaCores("0::/slice/pod\n", tree.root()), 2);
  // A namespaced container sees "/": its own cgroup is the mount's root.
  EXPECT_EQ(QuotaCores("0::/\n", tree.root()), std::nullopt);
  tree.Write("cpu.max", "100000 100000\n");
  EXPECT_EQ(QuotaCores("0::/\n", tree.root()), 1);
  // A path the mount does not have still reaches the root's limit.
  EXPECT_EQ(QuotaCores("0::/elsewhere/deep\n", tree.root()), 1);
}

TEST(CoresTest, CgroupV1CpuControllerQuotasAreRead) {
  CgroupTree tree;
  tree.Write("cpu,cpuacct/pod/cpu.cfs_quota_us", "400000\n");
  tree.Write("cpu,cpuacct/pod/cpu.cfs_period_us", "100000\n");
  tree.Write("cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  tree.Write("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  const std::string proc =
      "12:memory:/pod\n4:cpu,cpuacct:/pod\n1:name=systemd:/pod\n";
  EXPECT_EQ(QuotaCores(proc, tree.root()), 4);
  EXPECT_EQ(QuotaCores("4:cpuacct:/pod\n", tree.root()), std::nullopt);
  EXPECT_EQ(QuotaCores("garbage\n::\n0::relative\n", tree.root()),
            std::nullopt);
}

TEST(CoresTest, AvailableCoresIsAtLeastOneAndAtMostTheMachine) {
  const int cores = AvailableCores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, static_cast<int>(
                       std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace gpipe
