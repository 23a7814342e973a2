// Distances in units of the last place, for the tests that hold a float
// kernel to a double-precision reference.
#ifndef GPIPE_TESTS_SUPPORT_ULPS_H_
#define GPIPE_TESTS_SUPPORT_ULPS_H_

#include <cmath>

namespace gpipe::test_support {

// |got - want| in units of the last place of want (as a float). The
// spacing is taken in double: near the smallest normal float it is itself
// below it, and compute threads flush such floats to zero (denormals.h).
inline double Ulps(float got, double want) {
  const float w = static_cast<float>(want);
  const float next = std::nextafter(std::fabs(w), INFINITY);
  return std::fabs(got - want) /
         (static_cast<double>(next) - std::fabs(static_cast<double>(w)));
}

}  // namespace gpipe::test_support

#endif  // GPIPE_TESTS_SUPPORT_ULPS_H_
