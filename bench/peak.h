// The machine's sgemm peak as OpenBLAS reaches it: the yardstick every other
// figure in bench/ is a ratio of. Shared by gemm_bench and step_bench so both
// measure it the same way in the same run.
#ifndef GPIPE_BENCH_PEAK_H_
#define GPIPE_BENCH_PEAK_H_

#include <cstdint>

namespace gpipe::bench {

struct SgemmPeak {
  int threads = 0;      // OpenBLAS threads it ran with
  int64_t size = 0;     // square n = m = k
  int reps = 0;         // timed repetitions (after one warm-up)
  double best_s = 0.0;  // fastest repetition
  double gflops = 0.0;  // 2 n^3 / best_s / 1e9
};

// Calls cblas_sgemm directly (no gpipe code in between) on random n x n
// row-major matrices with OpenBLAS set to `threads` threads, and keeps the
// best of `reps`; then puts OpenBLAS's and OpenMP's thread counts back as
// they were (in the OpenMP build, openblas_set_num_threads also sets
// OpenMP's). 2048^3 takes ~0.1-0.2 s per rep on 2 AVX2 cores.
SgemmPeak MeasureSgemmPeak(int threads, int64_t size = 2048, int reps = 5);

// The multiply-add throughput our GEMM's register tile (the widest this CPU
// runs, services/tensor/cpu/gemm_tiles.h) reaches when nothing waits on
// memory: the tile run over and over on slivers in L1 on each of `threads`
// OpenMP threads at once. What our GEMM could reach at best on this CPU; on
// an AVX-512 CPU it is about twice what an AVX2 kernel can.
struct TilePeak {
  const char* tile = "";
  int threads = 0;
  double gflops = 0.0;  // all threads together, best of `reps`
};
TilePeak MeasureTilePeak(int threads, int reps = 5);

// The machine's memory bandwidth as a STREAM-like triad a[i] = b[i] + s c[i]
// reaches on the current compute threads (OpenMP, static schedule), over
// three arrays of `floats` each, far beyond the caches: the best of `reps`,
// counting 12 bytes an element (two reads and a write, as STREAM does).
struct TriadBandwidth {
  int threads = 0;
  int64_t floats = 0;
  double best_s = 0.0;
  double gbytes_per_s = 0.0;
};
TriadBandwidth MeasureTriad(int64_t floats = int64_t{16} << 20, int reps = 5);

}  // namespace gpipe::bench

#endif  // GPIPE_BENCH_PEAK_H_
