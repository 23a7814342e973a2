// The vectorized tanh (services/tensor/cpu/tanh.h): within a few ulp of
// double tanh across the floats, exact at the ends and NaN kept; the
// kernel gives the scalar bits in every lane and in the loop's remainder.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "services/tensor/cpu/elementwise.h"
#include "services/tensor/cpu/tanh.h"
#include "tests/support/ulps.h"

namespace gpipe::cpu {
namespace {

using test_support::Ulps;

// Every 97th float of [0, 12], with its negative: about 22 million values,
// every binade from the smallest normal float up, and both sides of the
// switch between the polynomial and the exponential at 0.55.
std::vector<float> Sweep() {
  const float bottom = FLT_MIN, top = 12.0f;
  uint32_t begin, end;
  std::memcpy(&begin, &bottom, sizeof begin);
  std::memcpy(&end, &top, sizeof end);
  std::vector<float> xs;
  for (uint32_t bits = begin; bits <= end; bits += 97) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    xs.push_back(x);
    xs.push_back(-x);
  }
  return xs;
}

TEST(TanhTest, IsWithinAFewUlpOfTheTrueValue) {
  double worst = 0;
  float worst_x = 0;
  for (float x : Sweep()) {
    const double u = Ulps(Tanh(x), std::tanh(static_cast<double>(x)));
    if (u > worst) worst = u, worst_x = x;
  }
  EXPECT_LE(worst, 2.0) << "at " << worst_x;
  RecordProperty("worst_ulp", std::to_string(worst));
}

TEST(TanhTest, EndsZerosAndNaN) {
  EXPECT_EQ(Tanh(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(Tanh(-0.0f)));
  EXPECT_EQ(Tanh(20.0f), 1.0f);
  EXPECT_EQ(Tanh(-1e30f), -1.0f);
  EXPECT_EQ(Tanh(INFINITY), 1.0f);
  EXPECT_EQ(Tanh(-INFINITY), -1.0f);
  EXPECT_TRUE(std::isnan(Tanh(NAN)));
  // Odd: the same bits on both sides.
  for (float x : {1e-20f, 0.3f, 0.5499f, 0.55f, 0.7f, 3.0f}) {
    EXPECT_EQ(Tanh(-x), -Tanh(x)) << x;
  }
}

TEST(TanhTest, TheKernelIsTheScalarArithmetic) {
  const std::vector<float> xs = Sweep();
  // An odd length: lanes and the scalar remainder both run.
  const int64_t n = static_cast<int64_t>(xs.size() / 16) | 1;
  std::vector<float> x(xs.begin(), xs.begin() + n), y(n);
  x[n / 2] = NAN;
  TanhForward(n, x.data(), y.data());
  for (int64_t i = 0; i < n; ++i) {
    const float want = Tanh(x[i]);
    ASSERT_EQ(std::memcmp(&y[i], &want, 4), 0) << x[i];
  }
}

}  // namespace
}  // namespace gpipe::cpu
