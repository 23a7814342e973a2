#include "services/tensor/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "services/tensor/cpu/softmax_row.h"
#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {

GPIPE_VECTOR_CLONES
void SoftmaxRows(int64_t rows, int64_t cols, const float* x, float* y) {
#pragma omp parallel for if (rows * cols > (1 << 14))
  for (int64_t r = 0; r < rows; ++r)
    SoftmaxRow(cols, x + r * cols, y + r * cols);
}

GPIPE_VECTOR_CLONES
void SoftmaxRowsBackward(int64_t rows, int64_t cols, const float* y,
                         const float* dy, float* dx) {
#pragma omp parallel for if (rows * cols > (1 << 14))
  for (int64_t r = 0; r < rows; ++r)
    SoftmaxRowBackward(cols, y + r * cols, dy + r * cols, 1.0f, dx + r * cols);
}

namespace {

// LaneSum of exp(z[c] - m) over the row, with no row to write the exps to
// (an evaluation): they go through a block on the stack, and each lane
// goes on from block to block, so the sum has the same bits.
[[gnu::always_inline]] inline float SumOfShiftedExps(int64_t n, const float* z,
                                                     float m) {
  constexpr int64_t kBlock = 1024;  // a multiple of kLanes
  float block[kBlock];
  float lane[kLanes] = {};
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) block[i] = ExpOfShifted(z[start + i] - m);
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lane[l] += block[i + l];
    for (int64_t l = 0; i < len; ++i, ++l) lane[l] += block[i];
  }
  return AddLanes(lane);
}

}  // namespace

// Vectorized like the softmax (softmax_row.h): libm's exp called twice an
// element, and a sum that waited on each add, took 4% of the triad, a
// second a step for a language model's 32000-token vocabulary.
GPIPE_VECTOR_CLONES
CrossEntropyResult SoftmaxCrossEntropy(int64_t rows, int64_t classes,
                                       const float* logits,
                                       const int32_t* targets,
                                       double normalizer, float* dlogits) {
  std::vector<double> row_loss(rows, 0.0);
  std::vector<char> row_correct(rows, 0);
  const float scale = static_cast<float>(1.0 / normalizer);
#pragma omp parallel for if (rows * classes > (1 << 14))
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    const int32_t t = targets[r];
    const bool valid = t >= 0 && t < classes;
    const LaneTop top = LaneArgMax(classes, z);
    const float m = top.value;
    float s;
    float* d = dlogits != nullptr ? dlogits + r * classes : nullptr;
    if (d != nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < classes; ++c) d[c] = ExpOfShifted(z[c] - m);
      s = LaneSum(classes, d);
    } else {
      s = SumOfShiftedExps(classes, z, m);
    }
    const float log_s = std::log(s);
    if (valid) {
      row_loss[r] = static_cast<double>(log_s - (z[t] - m));
      row_correct[r] = top.index == t;
    }
    if (d != nullptr) {
      if (!valid) {
#pragma omp simd
        for (int64_t c = 0; c < classes; ++c) d[c] = 0.0f;
      } else {
        const float inv = 1.0f / s;
#pragma omp simd
        for (int64_t c = 0; c < classes; ++c) d[c] = d[c] * inv * scale;
        d[t] -= scale;
      }
    }
  }
  CrossEntropyResult result;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] != -1 && (targets[r] < 0 || targets[r] >= classes)) {
      ++result.out_of_range;
      continue;
    }
    if (targets[r] < 0) continue;
    result.loss_sum += row_loss[r];
    result.counted += 1;
    result.correct += row_correct[r];
  }
  return result;
}

}  // namespace gpipe::cpu
