#include "services/tensor/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "services/tensor/cpu/loss_blocks.h"
#include "services/tensor/cpu/softmax_row.h"
#include "services/tensor/cpu/table_exp.h"
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

constexpr int64_t kBlock = 256;  // floats a block: in L1

// One row's exps against a running maximum, in one pass over the row: each
// block of kBlock logits is read from memory once for its largest value,
// then again from L1 for its exps and their sum. A block that raises the
// maximum scales the sum so far down to it first. The row's largest logit
// was a pass over the row of its own, from memory.
struct RowExps {
  float sum = 0;    // of exp(z - shift) over the row
  float max = 0;    // the largest logit (-inf for none but NaNs and -inf)
  float shift = 0;  // the last block's running maximum (at least -FLT_MAX)
};

// Each block's exps are against `shifts[b]` (kept for the gradient, which
// scales block b by exp(shifts[b] - max)), and block b's largest logit is
// `maxima[b]` (for the argmax). `e` null: only the sum is kept. Nothing
// depends on the vector width (LossBlockKernels).
RowExps OnlineExps(const LossBlockKernels& k, int64_t n, const float* z,
                   float* e, const float* next_z, float* shifts,
                   float* maxima) {
  static_assert(kBlock % kLossLanes == 0);  // a block starts at lane 0
  float lanes[kLossLanes] = {};
  // -FLT_MAX, not -inf, while no block has had a finite logit: a -inf
  // logit then shifts to -inf (its exp is 0), where -inf - -inf was NaN.
  float shift = -std::numeric_limits<float>::max();
  float row_max = -std::numeric_limits<float>::infinity();
  for (int64_t start = 0, b = 0; start < n; start += kBlock, ++b) {
    const int64_t len = std::min(kBlock, n - start);
    const float* x = z + start;
    // + 0: +0 for a largest zero whatever the order the kernel took.
    const float block_max = k.largest(len, x) + 0.0f;
    maxima[b] = block_max;
    row_max = block_max > row_max ? block_max : row_max;
    if (block_max > shift) {
      // What the lanes hold is against the old shift.
      const float f = TableExp(shift - block_max);
      for (float& lane : lanes) lane *= f;
      shift = block_max;
    }
    shifts[b] = shift;
    k.exps(len, x, shift, e != nullptr ? e + start : nullptr, lanes);
    if (next_z != nullptr)
      for (int64_t j = 0; j < len; j += 16)
        __builtin_prefetch(next_z + start + j, 0, 2);
  }
  return {AddLossLanes(lanes), row_max, shift};
}

// The first index of the row's largest logit, as a scalar scan from z[0]
// with `>` finds it: a NaN is never larger, so a NaN
// z[0] is the answer; else the first element equal to the largest, in the
// first block whose largest it is.
[[gnu::always_inline]] inline int64_t FirstLargest(int64_t n, const float* z,
                                                   const float* maxima,
                                                   float max) {
  if (z[0] != z[0]) return 0;
  for (int64_t start = 0, b = 0; start < n; start += kBlock, ++b) {
    if (!(maxima[b] == max)) continue;
    const int64_t end = std::min(n, start + kBlock);
    for (int64_t i = start; i < end; ++i)
      if (z[i] == max) return i;
  }
  return 0;  // not reached: z[0] is NaN, or some block's largest is max
}

}  // namespace

// libm's exp called twice an element, and a sum that waited on each add,
// took 4% of the triad, a second a step for a language model's 32000-token
// vocabulary. Each row is read from memory once (OnlineExps), its exps by
// the table (TableExp) in the widest registers the CPU has, its gradient
// scaled in place from L2.
GPIPE_VECTOR_CLONES
CrossEntropyResult SoftmaxCrossEntropy(int64_t rows, int64_t classes,
                                       const float* logits,
                                       const int32_t* targets,
                                       double normalizer, float* dlogits) {
  std::vector<double> row_loss(rows, 0.0);
  std::vector<char> row_correct(rows, 0);
  const float scale = static_cast<float>(1.0 / normalizer);
  const int64_t blocks = (classes + kBlock - 1) / kBlock;
  const LossBlockKernels& kernels = LossBlocksForThisCpu();
#pragma omp parallel if (rows * classes > (1 << 14))
  {
    std::vector<float> shifts(blocks), maxima(blocks);
#pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
      const float* z = logits + r * classes;
      const int32_t t = targets[r];
      const bool valid = t >= 0 && t < classes;
      float* d = dlogits != nullptr ? dlogits + r * classes : nullptr;
      const float* next_z = r + 1 < rows ? z + classes : nullptr;
      const RowExps x = OnlineExps(kernels, classes, z, d, next_z,
                                   shifts.data(), maxima.data());
      const float log_s = std::log(x.sum);
      if (valid) {
        row_loss[r] = static_cast<double>(log_s - (z[t] - x.shift));
        row_correct[r] = FirstLargest(classes, z, maxima.data(), x.max) == t;
      }
      if (d == nullptr) continue;
      if (!valid) {
#pragma omp simd
        for (int64_t c = 0; c < classes; ++c) d[c] = 0.0f;
        continue;
      }
      const float inv = 1.0f / x.sum;
      for (int64_t start = 0, b = 0; start < classes; start += kBlock, ++b) {
        // exp(z - shifts[b]) exp(shifts[b] - shift) / sum: 1 once the
        // running maximum is the row's.
        const float g = TableExp(shifts[b] - x.shift) * inv * scale;
        const int64_t len = std::min(kBlock, classes - start);
        float* block = d + start;
#pragma omp simd
        for (int64_t c = 0; c < len; ++c) block[c] *= g;
      }
      d[t] -= scale;
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
