// Softmax cross-entropy, mean over the mini-batch. Each micro-batch divides by
// the whole mini-batch's target count, so the micro-batch gradients add up to
// the exact mini-batch gradient.
#ifndef GPIPE_SERVICES_NN_LOSS_H_
#define GPIPE_SERVICES_NN_LOSS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "services/tensor/tensor.h"

namespace gpipe {

struct LossResult {
  double loss_sum = 0.0;  // sum over counted targets of -log p(target)
  int64_t counted = 0;    // targets that are not -1
  int64_t correct = 0;    // counted targets predicted right (argmax)
  // Targets outside the head's classes (neither -1 nor in [0, classes)):
  // not counted, no gradient; a stage refuses a step that has any
  // (CheckTargetsInRange).
  int64_t out_of_range = 0;

  LossResult& operator+=(const LossResult& o) {
    loss_sum += o.loss_sum;
    counted += o.counted;
    correct += o.correct;
    out_of_range += o.out_of_range;
    return *this;
  }
};

// logits [B, C] with targets [B], or [B, T, V] with targets [B, T]. When
// `dlogits` is not null it receives d(loss_sum / normalizer) / d(logits).
LossResult SoftmaxCrossEntropyLoss(const Tensor& logits, const Tensor& targets,
                                   double normalizer, Tensor* dlogits);

// InvalidArgument when `r` saw targets outside the `classes` of the head
// (data that does not fit the model: refused, never trained on).
absl::Status CheckTargetsInRange(const LossResult& r, int64_t classes);

// Targets that count (not -1): the normalizer of a mini-batch.
int64_t CountTargets(const Tensor& targets);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LOSS_H_
