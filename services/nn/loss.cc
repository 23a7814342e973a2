#include "services/nn/loss.h"

#include "services/tensor/ops.h"

namespace gpipe {

LossResult SoftmaxCrossEntropyLoss(const Tensor& logits, const Tensor& targets,
                                   double normalizer, Tensor* dlogits) {
  const int64_t classes = logits.dim(-1);
  const int64_t rows = logits.numel() / classes;
  // Labels come from the sampler on the host; they follow the logits.
  const Device d = logits.device();
  const Tensor t = targets.To(d);
  if (dlogits != nullptr)
    *dlogits = Tensor::Empty(logits.shape(), DType::kF32, d);
  const cpu::CrossEntropyResult r = ops::SoftmaxCrossEntropy(
      d, rows, classes, logits.f32(), t.i32(), normalizer,
      dlogits != nullptr ? dlogits->f32() : nullptr);
  return LossResult{r.loss_sum, r.counted, r.correct};
}

int64_t CountTargets(const Tensor& targets) {
  if (targets.device() != Device::kCpu)
    return CountTargets(targets.To(Device::kCpu));
  int64_t n = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) n += targets.i32()[i] >= 0;
  return n;
}

}  // namespace gpipe
