// The machine's sgemm peak as OpenBLAS reaches it: the yardstick every other
// figure in bench/ is a ratio of. Shared by gemm_bench and step_bench so both
// measure it the same way in the same run.
#ifndef GPIPE_BENCH_PEAK_H_
#define GPIPE_BENCH_PEAK_H_

#include <cstdint>

namespace gpipe::bench {

struct SgemmPeak {
  int64_t size = 0;     // square n = m = k
  int reps = 0;         // timed repetitions (after one warm-up)
  double best_s = 0.0;  // fastest repetition
  double gflops = 0.0;  // 2 n^3 / best_s / 1e9
};

// Calls cblas_sgemm directly (no gpipe code in between) on random n x n
// row-major matrices with the current OpenBLAS thread count, and keeps the
// best of `reps`. 2048^3 takes ~0.15 s per rep on 2 AVX2 cores.
SgemmPeak MeasureSgemmPeak(int64_t size = 2048, int reps = 5);

}  // namespace gpipe::bench

#endif  // GPIPE_BENCH_PEAK_H_
