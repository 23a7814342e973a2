// The cross-entropy's block passes (services/tensor/cpu/loss_blocks.h): the
// table exp is within 1.1 ulp of exp, and every implementation this CPU runs
// (plain C++, AVX2, AVX-512) gives the plain one's bits, at every length a
// block can have, with the special values a row of logits can hold.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/tensor/cpu/loss_blocks.h"
#include "services/tensor/cpu/table_exp.h"

namespace gpipe::cpu {
namespace {

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

float FromBits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof x);
  return x;
}

// The same bits, or NaN in both: which NaN's payload an operation passes on
// depends on its operands' order, which differs between the forms of a
// multiply-add.
bool SameValues(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (Bits(a[i]) != Bits(b[i]) && !(std::isnan(a[i]) && std::isnan(b[i])))
      return false;
  return true;
}

// |got - exp(a)| in units of the float spacing at exp(a).
double UlpError(float a, float got) {
  const double want = std::exp(static_cast<double>(a));
  int e;
  std::frexp(want, &e);
  return std::fabs(got - want) / std::ldexp(1.0, e - 24);
}

TEST(TableExpTest, ErrsAtMostATenthOverAnUlpOverItsRange) {
  double worst = 0;
  float worst_at = 0;
  // Every 61st float of [-87, 0]: the negative floats' bits run from -0 up
  // to -87's; then every 61st of (0, 0.5].
  for (uint32_t b = Bits(-0.0f); b <= Bits(-87.0f); b += 61) {
    const double err = UlpError(FromBits(b), TableExp(FromBits(b)));
    if (err > worst) worst = err, worst_at = FromBits(b);
  }
  for (uint32_t b = 1; b <= Bits(0.5f); b += 61) {
    const double err = UlpError(FromBits(b), TableExp(FromBits(b)));
    if (err > worst) worst = err, worst_at = FromBits(b);
  }
  RecordProperty("worst_ulp", std::to_string(worst));
  EXPECT_LT(worst, 1.1) << "at " << worst_at;
}

TEST(TableExpTest, KeepsItsEdges) {
  EXPECT_EQ(TableExp(0.0f), 1.0f);
  EXPECT_EQ(TableExp(-0.0f), 1.0f);
  EXPECT_EQ(Bits(TableExp(-87.01f)), Bits(0.0f));
  EXPECT_EQ(Bits(TableExp(-1e30f)), Bits(0.0f));
  EXPECT_EQ(Bits(TableExp(-std::numeric_limits<float>::infinity())),
            Bits(0.0f));
  EXPECT_TRUE(std::isnan(TableExp(std::nanf(""))));
  EXPECT_TRUE(std::isnan(TableExp(-std::nanf(""))));
  // A NaN with a payload: k from its bits is anything, the result NaN.
  EXPECT_TRUE(std::isnan(TableExp(FromBits(0x7fc12345u))));
  // exp(-87) is normal: 2^k joins the entry without leaving the normals.
  EXPECT_GE(TableExp(-87.0f), std::numeric_limits<float>::min());
  EXPECT_LT(UlpError(-87.0f, TableExp(-87.0f)), 1.1);
}

// Logits of a block as a row holds them: mostly within a few units of the
// shift, some far below it (exp underflows), and special values.
std::vector<float> Block(int64_t n, uint64_t seed, int pattern) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (float& v : x) v = (static_cast<float>(rng.Uniform()) - 0.7f) * 20.0f;
  const float inf = std::numeric_limits<float>::infinity();
  switch (pattern) {
    case 1:  // far below the shift, and -inf
      for (int64_t i = 0; i < n; i += 3) x[i] = -100.0f - i;
      x[n / 2] = -inf;
      break;
    case 2:  // NaNs, one with a payload
      x[n - 1] = std::nanf("");
      x[n / 3] = FromBits(0xffc0beefu);
      break;
    case 3:  // all -inf
      for (float& v : x) v = -inf;
      break;
    case 4:  // spread over the whole range of exps
      for (float& v : x) v = -static_cast<float>(rng.Uniform()) * 90.0f;
      break;
  }
  return x;
}

TEST(LossBlocksTest, EveryKernelGivesThePlainBits) {
  const std::vector<const LossBlockKernels*> kernels = LossBlocksThisCpuRuns();
  ASSERT_FALSE(kernels.empty());
  std::string names;
  for (const LossBlockKernels* k : kernels) names += std::string(k->name) + " ";
  RecordProperty("kernels", names);
  const LossBlockKernels& plain = *kernels.front();
  for (const LossBlockKernels* k : kernels) {
    SCOPED_TRACE(k->name);
    for (int64_t n = 1; n <= 256; ++n) {
      for (int pattern = 0; pattern < 5; ++pattern) {
        const std::vector<float> x = Block(n, 100 * n + pattern, pattern);
        // The shift: this block's largest, a larger one from an earlier
        // block, or the row's first (only -inf and NaN so far).
        for (const float shift : {plain.largest(n, x.data()) + 0.0f, 7.5f,
                                  -std::numeric_limits<float>::max()}) {
          if (shift < -1e30f && pattern != 3) continue;
          std::vector<float> want_lanes(kLossLanes), got_lanes(kLossLanes);
          Rng rng(n);
          for (int l = 0; l < kLossLanes; ++l)
            want_lanes[l] = got_lanes[l] =
                static_cast<float>(rng.Uniform()) * 3.0f;
          std::vector<float> want(n), got(n, -1.0f);
          plain.exps(n, x.data(), shift, want.data(), want_lanes.data());
          k->exps(n, x.data(), shift, got.data(), got_lanes.data());
          ASSERT_TRUE(SameValues(got.data(), want.data(), n))
              << n << " pattern " << pattern << " shift " << shift;
          ASSERT_TRUE(
              SameValues(got_lanes.data(), want_lanes.data(), kLossLanes))
              << n << " pattern " << pattern << " shift " << shift;
          // Without an output: the same sums, nothing written.
          std::vector<float> sum_only(kLossLanes);
          Rng again(n);
          for (float& l : sum_only)
            l = static_cast<float>(again.Uniform()) * 3.0f;
          k->exps(n, x.data(), shift, nullptr, sum_only.data());
          ASSERT_TRUE(
              SameValues(sum_only.data(), want_lanes.data(), kLossLanes))
              << n << " pattern " << pattern;
        }
        // The largest: one value whatever the order (the caller adds +0).
        const float want_max = plain.largest(n, x.data()) + 0.0f;
        const float got_max = k->largest(n, x.data()) + 0.0f;
        ASSERT_EQ(Bits(got_max), Bits(want_max)) << n << " pattern " << pattern;
      }
    }
  }
}

// A block that ends where readable memory does: a kernel that reads or
// writes past n faults.
class GuardedFloats {
 public:
  explicit GuardedFloats(int64_t n) : n_(n) {
    page_ = sysconf(_SC_PAGESIZE);
    base_ = mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(base_, MAP_FAILED);
    EXPECT_EQ(mprotect(static_cast<char*>(base_) + page_, page_, PROT_NONE), 0);
  }
  ~GuardedFloats() { munmap(base_, 2 * page_); }
  float* data() {
    return reinterpret_cast<float*>(static_cast<char*>(base_) + page_) - n_;
  }

 private:
  int64_t n_;
  long page_;
  void* base_;
};

TEST(LossBlocksTest, NoKernelTouchesMemoryPastTheBlock) {
  for (const LossBlockKernels* k : LossBlocksThisCpuRuns()) {
    SCOPED_TRACE(k->name);
    for (int64_t n = 1; n <= 256; ++n) {
      GuardedFloats x(n), out(n);
      const std::vector<float> logits = Block(n, n, 0);
      std::memcpy(x.data(), logits.data(), n * sizeof(float));
      float lanes[kLossLanes] = {};
      const float shift = k->largest(n, x.data()) + 0.0f;
      k->exps(n, x.data(), shift, out.data(), lanes);
      EXPECT_EQ(out.data()[n - 1], TableExp(logits[n - 1] - shift)) << n;
    }
  }
}

TEST(LossBlocksTest, TheLargestSkipsNaNsAndIsMinusInfinityForNone) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const LossBlockKernels* k : LossBlocksThisCpuRuns()) {
    SCOPED_TRACE(k->name);
    for (int64_t n : {1, 7, 8, 15, 16, 17, 63, 64, 65, 256}) {
      std::vector<float> x(n, std::nanf(""));
      EXPECT_EQ(k->largest(n, x.data()), -inf) << n;
      x[n - 1] = -inf;
      EXPECT_EQ(k->largest(n, x.data()), -inf) << n;
      x[n / 2] = -3.0f;
      EXPECT_EQ(k->largest(n, x.data()), -3.0f) << n;
      x[0] = inf;
      EXPECT_EQ(k->largest(n, x.data()), inf) << n;
      // A largest zero of both signs: equal to zero, +0 once +0 is added.
      for (float& v : x) v = -1.0f;
      x[0] = -0.0f;
      x[n - 1] = 0.0f;
      EXPECT_EQ(Bits(k->largest(n, x.data()) + 0.0f), Bits(0.0f)) << n;
    }
  }
}

}  // namespace
}  // namespace gpipe::cpu
