// Counter-based random numbers: every value is a pure function of a key and an
// index, so a re-materialized forward, another stage or another device draws
// exactly the same numbers (dropout masks, initialization, shuffles).
#ifndef GPIPE_SERVICES_CORE_RNG_H_
#define GPIPE_SERVICES_CORE_RNG_H_

#include <cmath>
#include <cstdint>
#include <initializer_list>

// Compiled by nvcc, the per-element functions also run on the device, so a
// CUDA kernel draws the same dropout masks as the CPU from the same key.
#if defined(__CUDACC__)
#define GPIPE_HOST_DEVICE __host__ __device__
#else
#define GPIPE_HOST_DEVICE
#endif

namespace gpipe {

GPIPE_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Folds several integers into one key; order matters.
inline uint64_t MixKey(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x243f6a8885a308d3ULL;
  for (uint64_t p : parts) h = SplitMix64(h ^ SplitMix64(p));
  return h;
}

// Uniform in [0, 1) with 24 random bits, exact in float: element `index` of
// the SplitMix64 sequence seeded with `key` (one mix of key + (index + 1)
// * gamma), the sequence that passes BigCrush. The counter advances by
// gamma, so a loop over indices carries it as an induction variable and the
// mix's two 64-bit multiplies are the whole cost (dropout's CPU loop). The
// bits go to float through a 32-bit integer (the same value), which
// vectorizes where a 64-bit conversion does not.
GPIPE_HOST_DEVICE inline float UniformAt(uint64_t key, uint64_t index) {
  return static_cast<float>(static_cast<int32_t>(
             SplitMix64(key + index * 0x9e3779b97f4a7c15ULL) >> 40)) *
         (1.0f / 16777216.0f);
}

// A small sequential generator for shuffles and synthetic data.
class Rng {
 public:
  explicit Rng(uint64_t key) : key_(key) {}
  uint64_t NextU64() { return SplitMix64(key_ ^ SplitMix64(counter_++)); }
  // Uniform integer in [0, n), n > 0. Rejection keeps it unbiased.
  uint64_t Below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do v = NextU64();
    while (v >= limit);
    return v % n;
  }
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }
  // Standard normal by Box-Muller, computed in double for portability.
  double Normal() {
    double u1 = Uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_CORE_RNG_H_
