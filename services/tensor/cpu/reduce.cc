#include "services/tensor/cpu/reduce.h"

#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {

// Vectorized across columns: each column's sum still runs over the rows in
// order.
GPIPE_VECTOR_CLONES
void SumRowsInto(int64_t rows, int64_t cols, const float* x, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) out[c] += row[c];
  }
}

// Each plane in float lanes (LaneSum), the planes in double in sample
// order, as batch norm sums: one dependent add per element took 5% of the
// CNN's step.
GPIPE_VECTOR_CLONES
void SumChannelsInto(int64_t n, int64_t channels, int64_t inner, const float* x,
                     float* out) {
#pragma omp parallel for if (n * channels * inner > (1 << 16))
  for (int64_t c = 0; c < channels; ++c) {
    double acc = 0.0;
    for (int64_t b = 0; b < n; ++b)
      acc += LaneSum(inner, x + (b * channels + c) * inner);
    out[c] += static_cast<float>(acc);
  }
}

double Sum(int64_t n, const float* x) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

GPIPE_VECTOR_CLONES
double SumSquares(int64_t n, const float* x) {
  // Eight running sums (element i goes to sum i % 8), added in a fixed tree
  // at the end: a function of the tensor alone, as before, but not one
  // chain of dependent adds (7M parameters took ~9 ms at an add's latency
  // each; the lanes run in parallel and vectorize).
  constexpr int64_t kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) {
      const double v = x[i + l];
      lane[l] += v * v;
    }
  }
  for (int64_t l = 0; i < n; ++i, ++l) {
    const double v = x[i];
    lane[l] += v * v;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
         ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

int64_t ArgMax(int64_t n, const float* x) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace gpipe::cpu
