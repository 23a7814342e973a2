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

// exp(z[c] - m) into e[c] (e null: an evaluation, which keeps none) and
// their LaneSum, in blocks of 256 that stay in L1: a block's dependent
// adds then run beside the next block's exps, where a pass of exps and
// then one of adds waited on an add's latency every 8 elements (1.51 ->
// 1.40 ms in `elementwise_bench`'s loss). Each lane goes on from block to
// block, so the sum has LaneSum's bits.
template <bool kKeep>
[[gnu::always_inline]] inline float ShiftedExpsAndSum(int64_t n, const float* z,
                                                      float m, float* e,
                                                      const float* next_z) {
  constexpr int64_t kBlock = 256;  // a multiple of kLanes
  float scratch[2][kBlock];
  float lane[kLanes] = {};
  // The adds of the block before the one just computed: adds straight
  // after the stores of their block waited on them.
  const auto add_block = [&lane](const float* block, int64_t len) {
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes)
      for (int64_t l = 0; l < kLanes; ++l) lane[l] += block[i + l];
    for (int64_t l = 0; i < len; ++i, ++l) lane[l] += block[i];
  };
  const float* pending = nullptr;
  int64_t pending_len = 0;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    float* block = kKeep ? e + start : scratch[(start / kBlock) % 2];
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) block[i] = ExpOfShifted(z[start + i] - m);
    if (next_z != nullptr)
      for (int64_t i = 0; i < len; i += 16)
        __builtin_prefetch(next_z + start + i, 0, 2);
    if (pending != nullptr) add_block(pending, pending_len);
    pending = block;
    pending_len = len;
  }
  add_block(pending, pending_len);
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
    float* d = dlogits != nullptr ? dlogits + r * classes : nullptr;
    const float* next_z = r + 1 < rows ? z + classes : nullptr;
    const float s = d != nullptr
                        ? ShiftedExpsAndSum<true>(classes, z, m, d, next_z)
                        : ShiftedExpsAndSum<false>(classes, z, m, d, next_z);
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
