// Flattens each sample to one dimension: [B, ...] -> [B, prod(...)].
#ifndef GPIPE_SERVICES_NN_LAYERS_FLATTEN_H_
#define GPIPE_SERVICES_NN_LAYERS_FLATTEN_H_

#include "services/nn/layer.h"

namespace gpipe {

class Flatten final : public Layer {
 public:
  // `sample_shape` is the per-sample input shape, needed to unflatten dy.
  explicit Flatten(Shape sample_shape)
      : sample_shape_(std::move(sample_shape)) {}
  std::string_view kind() const override { return "flatten"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext&, Saved*) override {
    return x.Reshape({x.dim(0), sample_shape_.numel()});
  }
  Tensor Backward(const Tensor& dy, const Saved&,
                  const LayerContext&) override {
    return dy.Reshape(sample_shape_.WithBatch(dy.dim(0)));
  }

 private:
  Shape sample_shape_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_FLATTEN_H_
