#include "services/nn/loss.h"

#include "absl/strings/str_cat.h"
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
  return LossResult{r.loss_sum, r.counted, r.correct, r.out_of_range};
}

absl::Status CheckTargetsInRange(const LossResult& r, int64_t classes) {
  if (r.out_of_range == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      r.out_of_range, " target(s) are outside the ", classes,
      " classes of the model's last layer (a label >= its output size, or "
      "negative other than -1): the data does not fit the model"));
}

int64_t CountTargets(const Tensor& targets) {
  if (targets.device() != Device::kCpu)
    return CountTargets(targets.To(Device::kCpu));
  int64_t n = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) n += targets.i32()[i] >= 0;
  return n;
}

}  // namespace gpipe
