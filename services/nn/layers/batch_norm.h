// Batch normalization with statistics per micro-batch, as GPipe does, and
// running averages (PyTorch's momentum convention) for evaluation. Works on
// [C, H, W] (per channel) and [F] (per feature) samples.
#ifndef GPIPE_SERVICES_NN_LAYERS_BATCH_NORM_H_
#define GPIPE_SERVICES_NN_LAYERS_BATCH_NORM_H_

#include "services/nn/layer.h"

namespace gpipe {

class BatchNorm final : public Layer {
 public:
  BatchNorm(const Shape& input, float momentum, float eps);
  std::string_view kind() const override { return "batch_norm"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;
  std::vector<Parameter*> Parameters() override { return {&weight_, &bias_}; }
  std::vector<NamedBuffer> Buffers() override;
  int64_t RunningStatisticsSize() const override { return 2 * channels_; }
  void ApplyRunningStatistics(const float* record) override;
  void Initialize(uint64_t key) override;

 private:
  int64_t channels_, inner_;
  float momentum_, eps_;
  Parameter weight_, bias_;
  Tensor running_mean_, running_var_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_BATCH_NORM_H_
