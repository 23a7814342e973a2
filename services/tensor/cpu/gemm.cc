#include "services/tensor/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace gpipe::cpu {
namespace {

// OpenBLAS's threaded GEMM splits work differently for each thread count, so
// its results change with the number of threads. We keep OpenBLAS
// single-threaded (SetComputeThreads) and parallelize over output panels of
// a fixed size instead: the same sequence of single-threaded calls runs
// whatever the thread count, and each output element is summed in the same
// order, so results are bitwise the same on 1 thread or 16.
// Panels are at least kMinPanel wide and at most kMaxPanels per call: a
// function of the shape alone.
//
// Every panel's call packs the operand all panels share (op(A) for column
// panels, op(B) for row panels) again, so a panel of width P pays a repack
// per P columns of work: at 128, about 10% of a large product on one
// thread (`gemm_bench --suite sizes`, the /plain column). When the shared
// operand is large (beyond L2, so each repack is memory traffic), panels
// are as wide as two panels allow, up to kWidePanel (under 3% at 512);
// small products keep narrow panels, where splitting over threads is worth
// more than the repack of a cached operand.
constexpr int64_t kMinPanel = 128;
constexpr int64_t kWidePanel = 512;
constexpr int64_t kLargeSharedFloats = int64_t{1} << 18;  // 1 MiB
constexpr int64_t kMaxPanels = 16;

int64_t PanelSize(int64_t extent, int64_t shared_floats) {
  const int64_t even = (extent + kMaxPanels - 1) / kMaxPanels;
  const int64_t half = ((extent + 1) / 2 + 15) / 16 * 16;
  const int64_t least = shared_floats >= kLargeSharedFloats
                            ? std::clamp(half, kMinPanel, kWidePanel)
                            : kMinPanel;
  return std::max(least, (even + 15) / 16 * 16);
}

void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
           float alpha, const float* a, int64_t lda, const float* b,
           int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
              ldb, beta, c, ldc);
}

}  // namespace

void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  static std::once_flag single_threaded_blas;
  std::call_once(single_threaded_blas, [] { openblas_set_num_threads(1); });
  if (std::max(m, n) <= kMinPanel && k >= 8 * kMinPanel) {
    // A small output over a long reduction (the weight gradient of a
    // convolution): fixed K-slices into private buffers, then added to C in
    // slice order, so the sum order is again a function of the shape alone.
    // No operand is shared between slices: narrow ones cost no repack.
    const int64_t slice = PanelSize(k, 0), slices = (k + slice - 1) / slice;
    std::vector<float> partial(slices * m * n);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < slices; ++p) {
      const int64_t k0 = p * slice, depth = std::min(slice, k - k0);
      const float* ap = trans_a ? a + k0 * lda : a + k0;
      const float* bp = trans_b ? b + k0 : b + k0 * ldb;
      Sgemm(trans_a, trans_b, m, n, depth, alpha, ap, lda, bp, ldb, 0.0f,
            partial.data() + p * m * n, n);
    }
    for (int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      for (int64_t j = 0; j < n; ++j) {
        float sum = beta == 0.0f ? 0.0f : beta * row[j];
        for (int64_t p = 0; p < slices; ++p)
          sum += partial[(p * m + i) * n + j];
        row[j] = sum;
      }
    }
    return;
  }
  if (m >= n) {
    // Row panels of C: rows of op(A).
    const int64_t panel = PanelSize(m, k * n), panels = (m + panel - 1) / panel;
#pragma omp parallel for schedule(static) if (panels > 1)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t r0 = p * panel, rows = std::min(panel, m - r0);
      const float* ap = trans_a ? a + r0 : a + r0 * lda;
      Sgemm(trans_a, trans_b, rows, n, k, alpha, ap, lda, b, ldb, beta,
            c + r0 * ldc, ldc);
    }
  } else {
    // Column panels of C: columns of op(B).
    const int64_t panel = PanelSize(n, m * k), panels = (n + panel - 1) / panel;
#pragma omp parallel for schedule(static) if (panels > 1)
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t c0 = p * panel, cols = std::min(panel, n - c0);
      const float* bp = trans_b ? b + c0 * ldb : b + c0;
      Sgemm(trans_a, trans_b, m, cols, k, alpha, a, lda, bp, ldb, beta, c + c0,
            ldc);
    }
  }
}

void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c) {
  GemmStrided(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b,
              trans_b ? k : n, beta, c, n);
}

void GemmRowStable(int64_t m, int64_t n, int64_t k, const float* a,
                   const float* w, float* c) {
  // Eight outputs at a time, each its own running sum over k in order:
  // eight independent chains keep the core busy without a transposed copy
  // of W (decoding calls this once per token per layer, with m = 1, where
  // copying W would cost as much as the product).
  constexpr int64_t kOutputs = 8;
#pragma omp parallel for schedule(static) if (m * n * k > (1 << 18))
  for (int64_t i = 0; i < m; ++i) {
    const float* ai = a + i * k;
    float* ci = c + i * n;
    for (int64_t j0 = 0; j0 < n; j0 += kOutputs) {
      const int64_t outputs = std::min(kOutputs, n - j0);
      float acc[kOutputs] = {};
      const float* rows[kOutputs];
      for (int64_t l = 0; l < kOutputs; ++l)
        rows[l] = w + (j0 + std::min(l, outputs - 1)) * k;
      for (int64_t p = 0; p < k; ++p) {
        const float x = ai[p];
        for (int64_t l = 0; l < kOutputs; ++l) acc[l] += x * rows[l][p];
      }
      std::copy(acc, acc + outputs, ci + j0);
    }
  }
}

}  // namespace gpipe::cpu
