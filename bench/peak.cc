#include "bench/peak.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <random>
#include <vector>

#include "bench/timing.h"

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
