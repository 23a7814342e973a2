// Pointwise nonlinearities: ReLU, GELU (exact, erf form) and Tanh.
#ifndef GPIPE_SERVICES_NN_LAYERS_ACTIVATIONS_H_
#define GPIPE_SERVICES_NN_LAYERS_ACTIVATIONS_H_

#include "services/nn/layer.h"

namespace gpipe {

class ReLU final : public Layer {
 public:
  std::string_view kind() const override { return "relu"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;
};

class GELU final : public Layer {
 public:
  std::string_view kind() const override { return "gelu"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;
};

class Tanh final : public Layer {
 public:
  std::string_view kind() const override { return "tanh"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_ACTIVATIONS_H_
