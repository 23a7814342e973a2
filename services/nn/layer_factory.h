// Makes a Layer from its spec. The spec must already have passed shape
// inference (layer_spec.h); `input` is the per-sample input shape.
#ifndef GPIPE_SERVICES_NN_LAYER_FACTORY_H_
#define GPIPE_SERVICES_NN_LAYER_FACTORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpipe/v1/model.pb.h"
#include "services/nn/layer.h"

namespace gpipe {

absl::StatusOr<std::unique_ptr<Layer>> MakeLayer(
    const gpipe::v1::LayerSpec& spec, const Shape& input);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYER_FACTORY_H_
