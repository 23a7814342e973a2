// Token embedding plus a learned position embedding: int32 ids [B, T] ->
// [B, T, dim]. The first layer of a language model; it has no input gradient.
#ifndef GPIPE_SERVICES_NN_LAYERS_EMBEDDING_H_
#define GPIPE_SERVICES_NN_LAYERS_EMBEDDING_H_

#include "services/nn/layer.h"

namespace gpipe {

class Embedding final : public Layer {
 public:
  Embedding(int64_t vocab_size, int64_t dim, int64_t max_positions);
  std::string_view kind() const override { return "embedding"; }
  bool RunsOn(Device) const override { return true; }
  absl::Status CheckInput(const Tensor& x) const override;
  // Positions [position, position + n): their rows of the position table.
  Tensor Decode(const Tensor& x, int64_t position, DecodeState* state) override;
  int64_t max_positions() const { return max_positions_; }
  int64_t vocab_size() const { return vocab_; }
  Tensor Forward(const Tensor& x, const LayerContext& ctx,
                 Saved* saved) override;
  Tensor Backward(const Tensor& dy, const Saved& saved,
                  const LayerContext& ctx) override;
  Tensor BackwardInput(const Tensor& dy, Saved& saved, const LayerContext& ctx,
                       Saved* deferred) override;
  void BackwardWeight(const Saved& saved, const Saved& deferred,
                      const LayerContext& ctx) override;
  std::vector<Parameter*> Parameters() override {
    return {&token_, &position_};
  }
  void Initialize(uint64_t key) override;

 private:
  int64_t vocab_, dim_, max_positions_;
  Parameter token_, position_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYERS_EMBEDDING_H_
