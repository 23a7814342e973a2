// A pre-LN Transformer block with its residuals inside, so a Transformer
// stays a plain sequence of layers that the pipeline can cut anywhere:
//   x1 = x + Dropout(Attn(LN1(x)));  y = x1 + Dropout(FC2(GELU(FC1(LN2(x1))))).
#ifndef GPIPE_SERVICES_NN_LAYERS_TRANSFORMER_BLOCK_H_
#define GPIPE_SERVICES_NN_LAYERS_TRANSFORMER_BLOCK_H_

#include "services/nn/layer.h"
#include "services/nn/layers/activations.h"
#include "services/nn/layers/attention.h"
#include "services/nn/layers/dropout.h"
#include "services/nn/layers/layer_norm.h"
#include "services/nn/layers/linear.h"

namespace gpipe {

class TransformerBlock final : public Layer {
 public:
  TransformerBlock(int64_t dim, int64_t heads, int64_t mlp_hidden,
                   float dropout, bool causal);
  std::string_view kind() const override { return "transformer_block"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;
  Tensor BackwardInput(const Tensor& dy, Saved& saved, const LayerContext& ctx,
                       Saved* deferred) override;
  void BackwardWeight(const Saved& saved, const Saved& deferred,
                      const LayerContext& ctx) override;
  Tensor Decode(const Tensor& x, int64_t position, DecodeState* state) override;
  bool Decodes() const override { return attn_.Decodes(); }
  std::vector<Parameter*> Parameters() override;
  void Initialize(uint64_t key) override;

 private:
  LayerNorm ln1_;
  SelfAttention attn_;
  Dropout drop1_;
  LayerNorm ln2_;
  Linear fc1_;
  GELU gelu_;
  Linear fc2_;
  Dropout drop2_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_TRANSFORMER_BLOCK_H_
