#include "services/tensor/cpu/softmax.h"

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
    float m = z[0];
    int64_t arg = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (z[c] > m) m = z[c], arg = c;
    float s = 0.0f;
    for (int64_t c = 0; c < classes; ++c) s += std::exp(z[c] - m);
    const float log_s = std::log(s);
    if (valid) {
      row_loss[r] = static_cast<double>(log_s - (z[t] - m));
      row_correct[r] = arg == t;
    }
    if (dlogits != nullptr) {
      float* d = dlogits + r * classes;
      if (!valid) {
        for (int64_t c = 0; c < classes; ++c) d[c] = 0.0f;
      } else {
        const float inv = 1.0f / s;
        for (int64_t c = 0; c < classes; ++c)
          d[c] = std::exp(z[c] - m) * inv * scale;
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
