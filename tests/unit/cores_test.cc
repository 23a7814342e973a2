#include "services/core/cores.h"

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

TEST(CoresTest, AvailableCoresIsAtLeastOneAndAtMostTheMachine) {
  const int cores = AvailableCores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, static_cast<int>(
                       std::max(1u, std::thread::hardware_concurrency())));
}

}  // namespace
}  // namespace gpipe
