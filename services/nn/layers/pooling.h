// Spatial pooling: MaxPool2d ([C,H,W] -> [C,OH,OW]) and GlobalAvgPool
// ([C,H,W] -> [C]).
#ifndef GPIPE_SERVICES_NN_LAYERS_POOLING_H_
#define GPIPE_SERVICES_NN_LAYERS_POOLING_H_

#include "services/nn/layer.h"

namespace gpipe {

class MaxPool2d final : public Layer {
 public:
  MaxPool2d(const Shape& input, int64_t kernel, int64_t stride)
      : input_(input), kernel_(kernel), stride_(stride) {}
  std::string_view kind() const override { return "max_pool2d"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;

 private:
  Shape input_;  // [C, H, W]
  int64_t kernel_, stride_;
};

class GlobalAvgPool final : public Layer {
 public:
  explicit GlobalAvgPool(const Shape& input) : input_(input) {}
  std::string_view kind() const override { return "global_avg_pool"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;

 private:
  Shape input_;  // [C, H, W]
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_POOLING_H_
