// y = x W^T + b over the last dimension; W is [out, in] as in PyTorch.
#ifndef GPIPE_SERVICES_NN_LAYERS_LINEAR_H_
#define GPIPE_SERVICES_NN_LAYERS_LINEAR_H_

#include "services/nn/layer.h"
#include "services/tensor/packed_weight.h"

namespace gpipe {

class Linear final : public Layer {
 public:
  // `prefix` names the parameters inside a composite layer ("attn.qkv.").
  Linear(int64_t in_features, int64_t out_features, bool bias,
         const std::string& prefix = "");
  std::string_view kind() const override { return "linear"; }
  bool RunsOn(Device) const override { return true; }
  // The same product with each output row a function of its input row
  // alone (cpu::GemmRowStable), so a position decoded alone gets what it
  // gets in a whole sequence decoded at once.
  Tensor Decode(const Tensor& x, int64_t position, DecodeState* state) override;
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;
  Tensor BackwardInput(const Tensor& dy, Saved& saved, const LayerContext& ctx,
                       Saved* deferred) override;
  void BackwardWeight(const Saved& saved, const Saved& deferred,
                      const LayerContext& ctx) override;
  // On the CPU one product over the group's rows, gathered: every element
  // of a product is one chain of multiply-adds over its rows in order
  // (cpu/gemm.h), so it is the micro-batches' products in turn, bit for bit.
  void BackwardWeights(std::span<const WeightHalf> halves) override;
  bool GroupsWeightHalves() const override {
    return weight_.value.device() == Device::kCpu;
  }
  WeightGroupCost GroupCost(const Saved& saved) const override;
  std::vector<Parameter*> Parameters() override;
  void PackWeights(bool input_grad) override;
  void Initialize(uint64_t key) override;

  // Bytes of the weight packed for the CPU GEMM now held (the memory model
  // counts LayerCost::packed_weight_bytes for them).
  int64_t packed_bytes() const {
    return forward_pack_.bytes() + input_grad_pack_.bytes();
  }
  // How many times its copies were packed (PackedWeight::packs).
  int64_t packs() const {
    return forward_pack_.packs() + input_grad_pack_.packs();
  }

  // Weight-only initialization scale for layers that prefer GPT-style N(0, s).
  void InitializeNormal(uint64_t key, float stddev);

 private:
  int64_t in_, out_;
  bool has_bias_;
  // dW += dy^T x and db += column sums of dy; dx = dy W.
  void WeightGrad(const Tensor& x, const Tensor& dy);
  Tensor InputGrad(const Tensor& x, const Tensor& dy) const;
  // C[rows, n] = A op(W): W^T with `trans` (the forward), else W (the input
  // gradient); on the CPU from the weight packed once while it is
  // unchanged (PackedWeight), elsewhere by ops::Gemm.
  void Product(bool trans, int64_t rows, int64_t n, int64_t k, const float* a,
               float* c) const;
  // y[rows, out] = x W^T + b: on the CPU the bias is added as the product
  // stores y (the bits of a separate pass, without the pass).
  void Affine(int64_t rows, const float* x, float* y) const;

  Parameter weight_, bias_;
  mutable PackedWeight forward_pack_, input_grad_pack_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_LINEAR_H_
