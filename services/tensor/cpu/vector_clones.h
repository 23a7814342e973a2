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

struct LaneTop {
  float value;
  int64_t index;
};

// The largest of x[0..n) (n >= 1) and the first index holding it, as a
// scalar scan from x[0] with `>` finds them: a NaN is never larger (so a
// NaN x[0] is the answer, at 0). Two passes: the largest value, then the
// first element equal to it. The answer is the scan's whatever the vector
// width: the largest value is one number (the two zeros compare equal, and
// the value returned is the element's own), and its first index is where
// the scan kept it, since a later equal element is not larger.
// The first pass keeps 32 running maxima in four 8-float vectors (GCC's
// vector extension: two registers each in the baseline clone), each a
// variable of its own: a loop over an array of them kept the array on the
// stack, a store and a reload each step, in both GCC's per-lane selects and
// its vector-extension loop.
[[gnu::always_inline]] inline LaneTop LaneArgMax(int64_t n, const float* x) {
  typedef float Floats8 __attribute__((vector_size(32)));
  typedef int32_t Ints8 __attribute__((vector_size(32)));
  constexpr int64_t kStep = 32;
  // By reference: a vector passed or returned by value changes the
  // baseline clone's ABI (-Wpsabi), though all of it is inlined.
  const auto keep_larger = [](Floats8& best, const float* p) {
    Floats8 v;
    std::memcpy(&v, p, sizeof v);
    const Ints8 larger = v > best;
    best = reinterpret_cast<Floats8>((reinterpret_cast<Ints8>(v) & larger) |
                                     (reinterpret_cast<Ints8>(best) & ~larger));
  };
  const auto mark_equal = [](Ints8& hit, const float* p, const Floats8& m) {
    Floats8 v;
    std::memcpy(&v, p, sizeof v);
    hit |= v == m;
  };
  Floats8 b0 = Floats8{} + x[0], b1 = b0, b2 = b0, b3 = b0;
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    keep_larger(b0, x + i);
    keep_larger(b1, x + i + 8);
    keep_larger(b2, x + i + 16);
    keep_larger(b3, x + i + 24);
  }
  const Floats8 best[] = {b0, b1, b2, b3};
  float m = x[0];
  for (const Floats8& b : best)
    for (int l = 0; l < 8; ++l) m = b[l] > m ? b[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  if (m != m) return {x[0], 0};  // x[0] is NaN: nothing was larger
  // The first block of kStep that holds m, then the element in it.
  int64_t start = 0;
  const Floats8 mv = Floats8{} + m;
  for (; start + kStep <= n; start += kStep) {
    Ints8 hit = {};
    for (int64_t g = 0; g < kStep; g += 8) mark_equal(hit, x + start + g, mv);
    uint64_t words[4];
    std::memcpy(words, &hit, sizeof words);
    if ((words[0] | words[1]) | (words[2] | words[3])) break;
  }
  for (int64_t j = start; j < n; ++j)
    if (x[j] == m) return {x[j], j};
  return {x[0], 0};  // not reached: m is one of x
}

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_VECTOR_CLONES_H_
