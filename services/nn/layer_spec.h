// Static checks on a model spec: the shape each layer produces, and what it
// costs. Runs before any tensor is allocated, so a malformed job fails at
// submission with a message naming the offending field, not deep in a stage.
#ifndef GPIPE_SERVICES_NN_LAYER_SPEC_H_
#define GPIPE_SERVICES_NN_LAYER_SPEC_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/model.pb.h"
#include "services/nn/layer.h"
#include "services/tensor/dtype.h"
#include "services/tensor/shape.h"

namespace gpipe {

// The largest size field (features, channels, vocabulary, ...) a spec may
// hold: token ids are int32, and bounding every size keeps the shape and
// cost arithmetic below far from int64 overflow.
inline constexpr int64_t kMaxSpecSize = (int64_t{1} << 31) - 1;
// The most elements one sample may have at any layer boundary.
inline constexpr int64_t kMaxSampleElements = int64_t{1} << 36;

// The proto field name of the layer's kind ("linear", "conv2d", ...), or ""
// when none is set.
std::string_view LayerKindName(const gpipe::v1::LayerSpec& spec);

// The per-sample output shape (no batch dimension) of the layer `spec` given
// a per-sample input. `path` names the layer in messages, e.g.
// "model.layers[3]"; errors are InvalidArgument and start with the full field
// path ("model.layers[3].linear.in_features: ...").
absl::StatusOr<Shape> InferOutputShape(const gpipe::v1::LayerSpec& spec,
                                       const Shape& input, DType input_dtype,
                                       std::string_view path);

// Per-sample forward FLOPs, fp32 parameter bytes and output activation bytes
// of a layer whose shapes InferOutputShape accepted. Estimates for the
// partitioner: exact for matrix products, rough for elementwise work.
LayerCost EstimateCost(const gpipe::v1::LayerSpec& spec, const Shape& input,
                       const Shape& output);

// Every layer's input and output shape and cost, in model order.
struct ModelShapes {
  std::vector<Shape> inputs;
  std::vector<Shape> outputs;
  std::vector<LayerCost> costs;
};

// Checks the whole model: its input header, each layer in turn, and that the
// loss fits the final output ([C] classes or [T, V] per token).
// The model's input alone: set, FLOAT32 or INT32, dims positive and within
// the sample limit; InvalidArgument naming the field. What reading the data
// for a spec needs first (InferModelShapes checks it too).
absl::Status CheckModelInput(const gpipe::v1::ModelSpec& model);

absl::StatusOr<ModelShapes> InferModelShapes(const gpipe::v1::ModelSpec& model);

// One tensor of a model's state, by the name Model::StateTensors gives it
// ("layers.3.weight"), with its shape (every one is float32). Parameters
// carry optimizer state; buffers (batch norm's running statistics) do not.
struct StateShape {
  std::string name;
  Shape shape;
  bool parameter = true;
};

// The state a model built from `model` holds, in Model::StateTensors'
// order, without making a layer: what the controller, which links no
// kernels, checks a job's starting weights against.
absl::StatusOr<std::vector<StateShape>> ModelStateShapes(
    const gpipe::v1::ModelSpec& model);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_LAYER_SPEC_H_
