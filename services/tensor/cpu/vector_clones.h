// Element-wise kernels compiled for the vector width the CPU has, with the
// same bits on every x86-64 CPU.
#ifndef GPIPE_SERVICES_TENSOR_CPU_VECTOR_CLONES_H_
#define GPIPE_SERVICES_TENSOR_CPU_VECTOR_CLONES_H_

#include <cstdint>
#include <cstring>

// GPIPE_VECTOR_CLONES before a kernel compiles it three times, for x86-64-v4
// (AVX-512: 16 floats a vector), x86-64-v3 (AVX2 and FMA: 8) and the
// x86-64 baseline the rest of the build targets (SSE2, 4); the dynamic
// loader picks one for the CPU it runs on (an ifunc), and GCC clones the
// kernel's OpenMP regions with it. Results are the same bits either way
// because nothing in a clone depends on the vector width: FMA contraction
// is off for the whole build (a fused multiply-add is written out as
// std::fma where one is wanted: an instruction in both vector clones, libm's
// exact fmaf in the baseline one), each element is computed by the same
// scalar operations in every lane, and the only sums across elements are
// over a fixed number of lanes (LaneSum below), never an OpenMP `simd
// reduction`, whose order follows the vector width.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GPIPE_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GPIPE_VECTOR_CLONES
#endif

namespace gpipe::cpu {

// Partial sums that make a row's sum independent of the vector width: term i
// goes to lane i % kLanes, and the lanes are added in a fixed tree. It also
// breaks the chain of n dependent adds a plain loop is (the row's length
// times an add's latency).
inline constexpr int64_t kLanes = 8;

[[gnu::always_inline]] inline float AddLanes(const float* lane) {
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
         ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// The sum of term(i) over [0, n), term i into lane i % kLanes.
template <typename Term>
[[gnu::always_inline]] inline float LaneSumOf(int64_t n, Term term) {
  float lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lane[l] += term(i + l);
  for (int64_t l = 0; i < n; ++i, ++l) lane[l] += term(i);
  return AddLanes(lane);
}

// The sum of x[0..n).
[[gnu::always_inline]] inline float LaneSum(int64_t n, const float* x) {
  return LaneSumOf(n, [x](int64_t i) { return x[i]; });
}

// The sum of (x[i] - m)^2 over [0, n).
[[gnu::always_inline]] inline float LaneSumSquaredDeviations(int64_t n,
                                                             const float* x,
                                                             float m) {
  return LaneSumOf(n, [x, m](int64_t i) {
    const float d = x[i] - m;
    return d * d;
  });
}

// The sum of a[i] * b[i] over [0, n).
[[gnu::always_inline]] inline float LaneDot(int64_t n, const float* a,
                                            const float* b) {
  return LaneSumOf(n, [a, b](int64_t i) { return a[i] * b[i]; });
}

// The largest of x[0..n) (n >= 1), NaN if any is (a NaN lane stays NaN
// through the later comparisons only if it is kept: so it is kept).
[[gnu::always_inline]] inline float LaneMax(int64_t n, const float* x) {
  float lane[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) lane[l] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const float v = x[i + l];
      lane[l] = v > lane[l] || v != v ? v : lane[l];
    }
  }
  for (int64_t l = 0; i < n; ++i, ++l) {
    const float v = x[i];
    lane[l] = v > lane[l] || v != v ? v : lane[l];
  }
  float m = lane[0];
  for (int64_t l = 1; l < kLanes; ++l) {
    const float v = lane[l];
    m = v > m || v != v ? v : m;
  }
  return m;
}

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_VECTOR_CLONES_H_
