// Inverted dropout whose mask is a pure function of (seed, step,
// micro-batch, layer index): the backward and any re-materialized forward
// regenerate it instead of storing it.
#ifndef GPIPE_SERVICES_NN_LAYERS_DROPOUT_H_
#define GPIPE_SERVICES_NN_LAYERS_DROPOUT_H_

#include "services/nn/layer.h"

namespace gpipe {

class Dropout final : public Layer {
 public:
  // `sub` tells apart several dropouts that share one layer index.
  explicit Dropout(float p, uint64_t sub = 0) : p_(p), sub_(sub) {}
  std::string_view kind() const override { return "dropout"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;

 private:
  float p_;
  uint64_t sub_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_DROPOUT_H_
