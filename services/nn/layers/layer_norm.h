// Layer normalization over the last dimension with a learned scale and shift.
#ifndef GPIPE_SERVICES_NN_LAYERS_LAYER_NORM_H_
#define GPIPE_SERVICES_NN_LAYERS_LAYER_NORM_H_

#include "services/nn/layer.h"

namespace gpipe {

class LayerNorm final : public Layer {
 public:
  LayerNorm(int64_t features, float eps, const std::string& prefix = "");
  std::string_view kind() const override { return "layer_norm"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;
  std::vector<Parameter*> Parameters() override { return {&weight_, &bias_}; }
  void Initialize(uint64_t key) override;

 private:
  int64_t features_;
  float eps_;
  Parameter weight_, bias_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_LAYER_NORM_H_
