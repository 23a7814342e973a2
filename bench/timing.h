// Wall-clock timing and the two statistics the benchmarks report.
#ifndef GPIPE_BENCH_TIMING_H_
#define GPIPE_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>

namespace gpipe::bench {

// Seconds one call of `fn` takes on the steady clock.
template <typename Fn>
double TimeSeconds(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

inline double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double Mean(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  return std::accumulate(v.begin(), v.end(), 0.0) /
         static_cast<double>(v.size());
}

}  // namespace gpipe::bench

#endif  // GPIPE_BENCH_TIMING_H_
