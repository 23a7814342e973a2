#include "services/nn/loss.h"

#include "services/tensor/cpu/softmax.h"

namespace gpipe {

LossResult SoftmaxCrossEntropyLoss(const Tensor& logits, const Tensor& targets,
                                   double normalizer, Tensor* dlogits) {
  const int64_t classes = logits.dim(-1);
  const int64_t rows = logits.numel() / classes;
  if (dlogits != nullptr) *dlogits = Tensor::Empty(logits.shape());
  const cpu::CrossEntropyResult r = cpu::SoftmaxCrossEntropy(
      rows, classes, logits.f32(), targets.i32(), normalizer,
      dlogits != nullptr ? dlogits->f32() : nullptr);
  return LossResult{r.loss_sum, r.counted, r.correct};
}

int64_t CountTargets(const Tensor& targets) {
  int64_t n = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) n += targets.i32()[i] >= 0;
  return n;
}

}  // namespace gpipe
