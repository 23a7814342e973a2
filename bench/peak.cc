#include "bench/peak.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <random>
#include <vector>

#include "bench/timing.h"
#include "services/tensor/cpu/gemm_tiles.h"

namespace gpipe::bench {

SgemmPeak MeasureSgemmPeak(int threads, int64_t size, int reps) {
  const int saved_blas = openblas_get_num_threads();
  const int saved_omp = omp_get_max_threads();
  openblas_set_num_threads(threads);
  const int64_t n = size;
  std::vector<float> a(n * n), b(n * n), c(n * n, 0.0f);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  auto once = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  once();  // warm-up: thread pool start, page faults, frequency ramp
  SgemmPeak peak;
  peak.threads = openblas_get_num_threads();
  peak.size = n;
  peak.reps = reps;
  peak.best_s = 1e30;
  for (int r = 0; r < reps; ++r)
    peak.best_s = std::min(peak.best_s, TimeSeconds(once));
  peak.gflops = 2.0 * n * n * n / peak.best_s / 1e9;
  openblas_set_num_threads(saved_blas);
  omp_set_num_threads(saved_omp);
  return peak;
}

TilePeak MeasureTilePeak(int threads, int reps) {
  const cpu::GemmTile& tile = cpu::BestGemmTile();
  constexpr int64_t kDepth = 256;  // slivers of 48 KiB at most: L1
  // About 10 ms a repetition: at 1 ms, a thread that lost its core for
  // the whole of every repetition once reported a quarter of the peak.
  constexpr int64_t kCalls = 20000;
  TilePeak peak;
  peak.tile = tile.name;
  peak.threads = threads;
  for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up
    const double s = TimeSeconds([&] {
#pragma omp parallel num_threads(threads)
      {
        std::vector<float> a(tile.mr * kDepth, 0.5f),
            b(tile.nr * kDepth, 0.25f), c(tile.mr * tile.nr, 0.0f);
        for (int64_t call = 0; call < kCalls; ++call)
          tile.run(kDepth, a.data(), b.data(), c.data(), tile.nr, true, 1.0f,
                   nullptr, nullptr, 0);
      }
    });
    const double gflops =
        2.0 * tile.mr * tile.nr * kDepth * kCalls * threads / s / 1e9;
    if (r > 0) peak.gflops = std::max(peak.gflops, gflops);
  }
  return peak;
}

TriadBandwidth MeasureTriad(int64_t floats, int reps) {
  std::vector<float> a(floats), b(floats, 1.0f), c(floats, 2.0f);
  const float s = 3.0f;
  auto once = [&] {
    float* pa = a.data();
    const float* pb = b.data();
    const float* pc = c.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < floats; ++i) pa[i] = pb[i] + s * pc[i];
  };
  once();  // faults the pages in
  TriadBandwidth t;
  t.threads = omp_get_max_threads();
  t.floats = floats;
  t.best_s = 1e30;
  for (int r = 0; r < reps; ++r)
    t.best_s = std::min(t.best_s, TimeSeconds(once));
  t.gbytes_per_s = 12.0 * static_cast<double>(floats) / t.best_s / 1e9;
  return t;
}

}  // namespace gpipe::bench
