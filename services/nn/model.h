// A contiguous range of a model's layers: the whole model for the reference
// trainer, one stage's layers in a pipeline. Layer indices and parameter
// names are global ("layers.<index>.<name>"), so any partition of the same
// spec starts from the same parameters and writes the same checkpoint names.
#ifndef GPIPE_SERVICES_NN_MODEL_H_
#define GPIPE_SERVICES_NN_MODEL_H_

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/model.pb.h"
#include "services/nn/layer.h"
#include "services/nn/layer_timing.h"
#include "services/nn/running_statistics.h"

namespace gpipe {

struct NamedParameter {
  std::string name;  // global: "layers.3.weight"
  Parameter* param;
};

struct NamedTensor {
  std::string name;
  Tensor* tensor;
};

class Model {
 public:
  // Builds layers [begin, end) of `spec` (end < 0: to the last layer) and
  // initializes them from `seed` and their global index.
  static absl::StatusOr<std::unique_ptr<Model>> Build(
      const gpipe::v1::ModelSpec& spec, uint64_t seed, int64_t begin = 0,
      int64_t end = -1);

  int64_t begin() const { return begin_; }
  int64_t end() const { return begin_ + static_cast<int64_t>(layers_.size()); }
  int64_t size() const { return static_cast<int64_t>(layers_.size()); }
  Layer& layer(int64_t local) { return *layers_[local]; }

  // Runs every layer; `ctx.layer_index` is set per layer. `saved` (resized
  // to size()) receives what backward needs, or is null for evaluation.
  Tensor Forward(const Tensor& x, LayerContext ctx, std::vector<Saved>* saved);
  // Incremental decoding through every layer (Layer::Decode); `states`
  // holds one DecodeState per layer.
  Tensor Decode(const Tensor& x, int64_t position,
                std::vector<DecodeState>* states);
  // The first layer's CheckInput (Layer::CheckInput).
  absl::Status CheckInput(const Tensor& x) const {
    return layers_.empty() ? absl::OkStatus() : layers_.front()->CheckInput(x);
  }
  // Backward through every layer in reverse; returns the input gradient.
  // `after_layer(i)` (optional) runs once layer i (local) has added its
  // parameters' gradients: a caller may start using them while the layers
  // below compute.
  Tensor Backward(const Tensor& dy, const std::vector<Saved>& saved,
                  LayerContext ctx,
                  const std::function<void(int64_t)>& after_layer = nullptr);
  // The backward in two halves (Layer::BackwardInput / BackwardWeight):
  // the input gradient now, with what the weight half needs kept in
  // `deferred` (resized to size()) and the rest of `saved` dropped, and the
  // parameter gradients later. Together they add Backward's parameter
  // gradients bit for bit.
  Tensor BackwardInput(const Tensor& dy, std::vector<Saved>* saved,
                       LayerContext ctx, std::vector<Saved>* deferred);
  // `after_layer` as Backward's.
  void BackwardWeight(
      const std::vector<Saved>& saved, const std::vector<Saved>& deferred,
      LayerContext ctx,
      const std::function<void(int64_t)>& after_layer = nullptr);

  // Backward with the weight halves of the layers that group them
  // (Layer::GroupsWeightHalves) left in `deferred` (resized to size()) for
  // BackwardWeights, and every other layer's parameter gradients added
  // now, as Backward adds them. Returns the input gradient.
  Tensor BackwardGrouping(const Tensor& dy, std::vector<Saved>* saved,
                          LayerContext ctx, std::vector<Saved>* deferred);
  // What BackwardGrouping left of each of several micro-batches, in the
  // order their gradients add up.
  struct DeferredWeights {
    const std::vector<Saved>* saved = nullptr;
    const std::vector<Saved>* deferred = nullptr;
    LayerContext ctx;
  };
  // Their weight halves, a group per layer (Layer::BackwardWeights): the
  // parameter gradients of the micro-batches' Backward calls, bit for bit.
  // `every_layer`: what BackwardInput left (every layer's weight half);
  // else what BackwardGrouping left (the grouping layers'). `after_layer(i)`
  // runs once layer i's gradients are all in, for every layer, last to
  // first.
  void BackwardWeights(
      std::span<const DeferredWeights> micro_batches, bool every_layer,
      const std::function<void(int64_t)>& after_layer = nullptr);
  // Whether any layer groups its weight halves: BackwardGrouping is
  // Backward otherwise.
  bool GroupsWeightHalves() const;
  // How many micro-batches like the one whose forward saved `saved` the
  // trainers group the weight halves of (gpipe::WeightGroupSize over the
  // grouping layers' Layer::GroupCost).
  // With `samples` and `as_samples`, for micro-batches of `as_samples`
  // samples where `saved` holds `samples`.
  int64_t WeightGroupSize(const std::vector<Saved>& saved, int64_t samples = 0,
                          int64_t as_samples = 0) const;

  const std::vector<NamedParameter>& Parameters() const { return params_; }
  // Parameters and buffers by global name: what a checkpoint holds.
  std::vector<NamedTensor> StateTensors();
  void ZeroGrad();
  // Layer::PackWeights for the layer of Parameters()[i] once i is its last
  // parameter (the model's first layer without its input gradient's copy:
  // nobody reads it): an optimizer's `updated` callback, so each weight is
  // packed right after its update, while it is in the cache, not read back
  // from memory in a pass of its own. Packing moves floats: the bits of
  // the products are the same.
  void PackAfterUpdate(size_t i);

  // Running statistics held back to the step's end (RunningStatistics):
  // the floats a micro-batch records across the layers (0: none); the
  // records of micro-batches [begin, end) in `log` as host rows
  // [end - begin, width], each row the layers' records in layer order
  // (FAILED_PRECONDITION names a micro-batch whose forward recorded
  // nothing); and the layers' buffers moved by `rows`, one micro-batch
  // after another in row order (INVALID_ARGUMENT for rows of another
  // width).
  int64_t RunningStatisticsWidth() const;
  absl::StatusOr<Tensor> RunningStatisticsRows(const RunningStatistics& log,
                                               int64_t begin,
                                               int64_t end) const;
  absl::Status ApplyRunningStatistics(const Tensor& rows);

  // Moves parameters, gradients and buffers to `device` (inputs must then
  // be on it too). FAILED_PRECONDITION names a layer without kernels there.
  absl::Status To(Device device);

  // Times every layer's forward (training, not re-materialized) and
  // backward into `timing` (not owned; null: none), which must have
  // size() layers.
  void set_timing(LayerTiming* timing) { timing_ = timing; }

 private:
  Model() = default;
  template <typename Pass>
  void EachLayerBackward(LayerContext ctx, Pass pass);
  int64_t begin_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<NamedParameter> params_;
  // The local layer of each of params_.
  std::vector<int64_t> param_layers_;
  LayerTiming* timing_ = nullptr;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_MODEL_H_
