#include "services/nn/layer_factory.h"

#include "absl/status/status.h"
#include "services/nn/layers/activations.h"
#include "services/nn/layers/attention.h"
#include "services/nn/layers/batch_norm.h"
#include "services/nn/layers/conv2d.h"
#include "services/nn/layers/dropout.h"
#include "services/nn/layers/embedding.h"
#include "services/nn/layers/flatten.h"
#include "services/nn/layers/layer_norm.h"
#include "services/nn/layers/linear.h"
#include "services/nn/layers/pooling.h"
#include "services/nn/layers/transformer_block.h"

namespace gpipe {

using gpipe::v1::LayerSpec;

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(const LayerSpec& spec,
                                                 const Shape& input) {
  switch (spec.kind_case()) {
    case LayerSpec::kLinear: {
      const auto& s = spec.linear();
      return std::make_unique<Linear>(s.in_features(), s.out_features(),
                                      !s.has_bias() || s.bias());
    }
    case LayerSpec::kRelu:
      return std::make_unique<ReLU>();
    case LayerSpec::kGelu:
      return std::make_unique<GELU>();
    case LayerSpec::kTanh:
      return std::make_unique<Tanh>();
    case LayerSpec::kDropout:
      return std::make_unique<Dropout>(spec.dropout().p());
    case LayerSpec::kLayerNorm: {
      const auto& s = spec.layer_norm();
      return std::make_unique<LayerNorm>(s.features(),
                                         s.has_eps() ? s.eps() : 1e-5f);
    }
    case LayerSpec::kEmbedding: {
      const auto& s = spec.embedding();
      return std::make_unique<Embedding>(s.vocab_size(), s.dim(),
                                         s.max_positions());
    }
    case LayerSpec::kSelfAttention: {
      const auto& s = spec.self_attention();
      return std::make_unique<SelfAttention>(s.dim(), s.heads(),
                                             !s.has_causal() || s.causal());
    }
    case LayerSpec::kTransformerBlock: {
      const auto& s = spec.transformer_block();
      return std::make_unique<TransformerBlock>(
          s.dim(), s.heads(), s.mlp_hidden() > 0 ? s.mlp_hidden() : 4 * s.dim(),
          s.dropout(), !s.has_causal() || s.causal());
    }
    case LayerSpec::kConv2D: {
      const auto& s = spec.conv2d();
      return std::make_unique<Conv2d>(input, s.out_channels(), s.kernel_size(),
                                      s.has_stride() ? s.stride() : 1,
                                      s.padding(), !s.has_bias() || s.bias());
    }
    case LayerSpec::kMaxPool2D: {
      const auto& s = spec.max_pool2d();
      return std::make_unique<MaxPool2d>(
          input, s.kernel_size(),
          s.has_stride() ? s.stride() : s.kernel_size());
    }
    case LayerSpec::kGlobalAvgPool:
      return std::make_unique<GlobalAvgPool>(input);
    case LayerSpec::kFlatten:
      return std::make_unique<Flatten>(input);
    case LayerSpec::kBatchNorm: {
      const auto& s = spec.batch_norm();
      return std::make_unique<BatchNorm>(input,
                                         s.has_momentum() ? s.momentum() : 0.1f,
                                         s.has_eps() ? s.eps() : 1e-5f);
    }
    case LayerSpec::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("layer: no layer kind set");
}

}  // namespace gpipe
