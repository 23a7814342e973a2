// 2-D convolution (ops::Conv2dForward: im2col and one GEMM per chunk of
// samples, or cuDNN on a GPU): [B, Cin, H, W] -> [B, Cout, OH, OW]; weight
// [Cout, Cin, k, k] as PyTorch.
#ifndef GPIPE_SERVICES_NN_LAYERS_CONV2D_H_
#define GPIPE_SERVICES_NN_LAYERS_CONV2D_H_

#include "services/nn/layer.h"
#include "services/tensor/cpu/conv.h"

namespace gpipe {

class Conv2d final : public Layer {
 public:
  // `input` is the per-sample shape [Cin, H, W].
  Conv2d(const Shape& input, int64_t out_channels, int64_t kernel,
         int64_t stride, int64_t padding, bool bias);
  std::string_view kind() const override { return "conv2d"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;
  Tensor BackwardInput(const Tensor& dy, Saved& saved, const LayerContext& ctx,
                       Saved* deferred) override;
  void BackwardWeight(const Saved& saved, const Saved& deferred,
                      const LayerContext& ctx) override;
  std::vector<Parameter*> Parameters() override;
  void Initialize(uint64_t key) override;

 private:
  // The input gradient (returned; undefined unless `input`) and, with
  // `weight`, the weight and bias gradients added in.
  Tensor Gradients(const Tensor& x, const Tensor& dy, bool input, bool weight);

  cpu::ConvGeometry geometry_;
  int64_t out_channels_;
  bool has_bias_;
  Parameter weight_, bias_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_CONV2D_H_
