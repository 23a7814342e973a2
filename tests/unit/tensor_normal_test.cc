// The GELU's normal cdf and density (services/tensor/cpu/normal.h): within
// a few ulp of double-precision erfc and exp across the floats, tails
// included; and the vectorized GELU kernels give the scalar bits in every
// lane and in the loop's remainder.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "services/tensor/cpu/elementwise.h"
#include "services/tensor/cpu/normal.h"
#include "tests/support/ulps.h"

namespace gpipe::cpu {
namespace {

using test_support::Ulps;

// Every 997th float of [0, 14], with its negative: about two million
// values, every binade down to the denormals.
std::vector<float> Sweep() {
  const float top = 14.0f;
  uint32_t end;
  std::memcpy(&end, &top, sizeof end);
  std::vector<float> xs;
  for (uint32_t bits = 0; bits <= end; bits += 997) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    xs.push_back(x);
    xs.push_back(-x);
  }
  return xs;
}

TEST(NormalTest, CdfAndDensityAreWithinAFewUlp) {
  double worst_cdf = 0, worst_pdf = 0, worst_gelu = 0;
  for (float x : Sweep()) {
    const NormalAt v = Normal(x);
    const double xd = x;
    const double cdf = 0.5 * std::erfc(-xd / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * xd * xd) / std::sqrt(2 * M_PI);
    if (cdf > 1e-37) worst_cdf = std::max(worst_cdf, Ulps(v.cdf, cdf));
    if (pdf > 1e-37) worst_pdf = std::max(worst_pdf, Ulps(v.pdf, pdf));
    // Where Phi itself is below the smallest normal float, compute threads
    // flush it to zero (denormals.h), and so the GELU.
    if (std::fabs(xd * cdf) > 1e-37 && cdf >= FLT_MIN)
      worst_gelu = std::max(worst_gelu, Ulps(x * v.cdf, xd * cdf));
  }
  EXPECT_LE(worst_cdf, 6.0);
  EXPECT_LE(worst_pdf, 3.0);
  EXPECT_LE(worst_gelu, 6.0);
  // Far tails: nothing below float's range, nothing above 1.
  EXPECT_EQ(Normal(-20.0f).cdf, 0.0f);
  EXPECT_EQ(Normal(20.0f).cdf, 1.0f);
  EXPECT_EQ(Normal(0.0f).cdf, 0.5f);
}

// exp(-x^2/2) as Normal takes it: ExpOfMinusHalfSum carries every step of
// the plain reduction of -x^2/2 on -2 times its value, which must round
// the same, so its bits are the plain steps' (checked on every float once,
// with and without subnormals flushed; here on every 97th float of
// [0, 14], where the sweep above takes every 997th).
TEST(NormalTest, TheFoldedHalvingGivesThePlainStepsBits) {
  const auto plain = [](float x) {
    const float ax = std::fabs(x);
    const float half = -0.5f * ax;
    const float hi = half * ax;
    const float lo = std::fma(half, ax, -hi);
    const float a = hi >= -87.0f ? hi : -87.0f;
    const float j = std::fma(a, kLog2e, kRound);
    const float kf = j - kRound;
    const float r = std::fma(kf, -kLn2Lo, std::fma(kf, -kLn2Hi, a)) + lo;
    uint32_t j_bits;
    std::memcpy(&j_bits, &j, sizeof j_bits);
    return ExpReduced(r, static_cast<int32_t>(j_bits - 0x4b400000u));
  };
  const float top = 14.0f;
  uint32_t end;
  std::memcpy(&end, &top, sizeof end);
  int64_t checked = 0;
  for (uint32_t bits = 0; bits <= end; bits += 97) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    const float u = x * x;
    const float folded =
        ExpOfMinusHalfSum(u <= 174.0f ? u : 174.0f, std::fma(x, x, -u));
    const float want = plain(x);
    ASSERT_EQ(std::memcmp(&folded, &want, sizeof want), 0)
        << "x = " << x << ": " << folded << " against " << want;
    ++checked;
  }
  EXPECT_GT(checked, 10000000);
}

// The exp under the GELU, the softmaxes and tanh: within 0.9 ulp of double
// exp on every 97th float of [-87, 0.5] (ExpReduced's degree-6 polynomial;
// 0.88 at worst over every float there).
TEST(NormalTest, ExpOfSmallIsWithinAnUlp) {
  double worst = 0;
  float worst_at = 0;
  for (float x = -87.0f; x <= 0.5f;) {
    const double u = Ulps(ExpOfSmall(x), std::exp(static_cast<double>(x)));
    if (u > worst) {
      worst = u;
      worst_at = x;
    }
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    // Toward zero from -87, then away from it past 0: 97 floats a step.
    const bool negative = (bits & 0x80000000u) != 0;  // -0 included
    bits = negative ? (bits - 97 <= 0x80000000u ? 0 : bits - 97) : bits + 97;
    std::memcpy(&x, &bits, sizeof x);
  }
  EXPECT_LE(worst, 0.9) << "at " << worst_at;
  EXPECT_EQ(ExpOfSmall(0.0f), 1.0f);
}

TEST(NormalTest, VectorizedGeluIsTheScalarArithmetic) {
  // An odd length: lanes and the scalar remainder both run.
  const std::vector<float> xs = Sweep();
  const int64_t n = static_cast<int64_t>(xs.size()) | 1;
  std::vector<float> x(xs.begin(), xs.begin() + n), y(n), dy(n, 1.5f), dx(n);
  GeluForward(n, x.data(), y.data());
  GeluBackward(n, x.data(), dy.data(), dx.data());
  for (int64_t i = 0; i < n; ++i) {
    const NormalAt v = Normal(x[i]);
    const float want_y = x[i] * v.cdf;
    const float want_dx = dy[i] * (v.cdf + x[i] * v.pdf);
    ASSERT_EQ(std::memcmp(&y[i], &want_y, 4), 0) << x[i];
    ASSERT_EQ(std::memcmp(&dx[i], &want_dx, 4), 0) << x[i];
  }
}

}  // namespace
}  // namespace gpipe::cpu
