// Multi-head self-attention with its input (q, k, v) and output projections:
// [B, T, dim] -> [B, T, dim], causal by default.
#ifndef GPIPE_SERVICES_NN_LAYERS_ATTENTION_H_
#define GPIPE_SERVICES_NN_LAYERS_ATTENTION_H_

#include "services/nn/layer.h"
#include "services/nn/layers/linear.h"

namespace gpipe {

class SelfAttention final : public Layer {
 public:
  SelfAttention(int64_t dim, int64_t heads, bool causal,
                const std::string& prefix = "");
  std::string_view kind() const override { return "self_attention"; }
  bool RunsOn(Device) const override { return true; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;
  Tensor BackwardInput(const Tensor& dy, Saved& saved, const LayerContext& ctx,
                       Saved* deferred) override;
  void BackwardWeight(const Saved& saved, const Saved& deferred,
                      const LayerContext& ctx) override;
  // Appends the new positions' q, k, v rows to `state` and attends over
  // every row so far, in the order Forward sums (bitwise its outputs).
  Tensor Decode(const Tensor& x, int64_t position, DecodeState* state) override;
  bool Decodes() const override { return causal_; }
  std::vector<Parameter*> Parameters() override;
  void Initialize(uint64_t key) override;

 private:
  int64_t dim_, heads_;
  bool causal_;
  Linear qkv_, proj_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_ATTENTION_H_
