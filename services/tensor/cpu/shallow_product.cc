#include "services/tensor/cpu/shallow_product.h"

#include <cmath>

#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {
namespace {

// Up to this depth a product runs here: a first convolution's 9 (grey,
// 3 x 3) to 27 (RGB) taps.
constexpr int64_t kMostShallowDepth = 32;

// Each row of y is its own accumulator: its chains run a tap at a time
// across the row (a vector loop over j), where a loop over the taps inside
// one over j does not vectorize.
template <bool kBias>
[[gnu::always_inline]] inline void ProductRows(int64_t rows, int64_t n,
                                               int64_t depth, const float* w,
                                               const float* col, int64_t ldcol,
                                               const float* bias, float* y,
                                               int64_t ldy) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* const wi = w + i * depth;
    float* const yi = y + i * ldy;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) yi[j] = 0.0f;
    for (int64_t t = 0; t < depth; ++t) {
      const float wt = wi[t];
      const float* const ct = col + t * ldcol;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yi[j] = std::fma(wt, ct[j], yi[j]);
    }
    // With no bias nothing is added: acc + 0 would turn -0 into +0.
    if (kBias) {
      const float b = bias[i];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) yi[j] = yi[j] + b;
    }
  }
}

}  // namespace

bool ShallowDepth(int64_t depth) { return depth <= kMostShallowDepth; }

GPIPE_VECTOR_CLONES
void ShallowProduct(int64_t rows, int64_t n, int64_t depth, const float* w,
                    const float* col, int64_t ldcol, const float* bias,
                    float* y, int64_t ldy) {
  if (bias != nullptr)
    ProductRows<true>(rows, n, depth, w, col, ldcol, bias, y, ldy);
  else
    ProductRows<false>(rows, n, depth, w, col, ldcol, bias, y, ldy);
}

}  // namespace gpipe::cpu
