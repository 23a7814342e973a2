// Row-wise softmax and the softmax cross-entropy loss.
#ifndef GPIPE_SERVICES_TENSOR_CPU_SOFTMAX_H_
#define GPIPE_SERVICES_TENSOR_CPU_SOFTMAX_H_

#include <cstdint>

namespace gpipe::cpu {

void SoftmaxRows(int64_t rows, int64_t cols, const float* x, float* y);
// dx = y * (dy - sum(dy * y)) per row; y is the forward output.
void SoftmaxRowsBackward(int64_t rows, int64_t cols, const float* y,
                         const float* dy, float* dx);

struct CrossEntropyResult {
  double loss_sum = 0.0;  // sum of -log p(target) over counted rows
  int64_t counted = 0;    // rows whose target is not -1
  int64_t correct = 0;    // counted rows whose argmax is the target
  // Rows whose target is neither -1 nor a class in [0, classes): never read
  // through (their loss and gradient are zero); the caller refuses them.
  int64_t out_of_range = 0;
};

// Softmax cross-entropy of `rows` logit rows against integer targets (-1:
// ignored). When `dlogits` is not null it receives d(loss_sum/normalizer),
// so micro-batches that share the mini-batch's normalizer add up to the
// mini-batch mean's gradient. Rows are independent, so threads don't matter.
CrossEntropyResult SoftmaxCrossEntropy(int64_t rows, int64_t classes,
                                       const float* logits,
                                       const int32_t* targets,
                                       double normalizer, float* dlogits);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_SOFTMAX_H_
