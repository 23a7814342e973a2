#include "services/nn/model.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/nn/layer_factory.h"
#include "services/nn/layer_spec.h"
#include "services/nn/weight_groups.h"
#include "services/tensor/device.h"

namespace gpipe {

absl::StatusOr<std::unique_ptr<Model>> Model::Build(
    const gpipe::v1::ModelSpec& spec, uint64_t seed, int64_t begin,
    int64_t end) {
  ASSIGN_OR_RETURN(ModelShapes shapes, InferModelShapes(spec));
  const int64_t n = spec.layers_size();
  if (end < 0) end = n;
  if (begin < 0 || begin >= end || end > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: layer range [", begin, ", ", end, ") is not within 0..", n));
  }
  std::unique_ptr<Model> model(new Model());
  model->begin_ = begin;
  for (int64_t i = begin; i < end; ++i) {
    ASSIGN_OR_RETURN(std::unique_ptr<Layer> layer,
                     MakeLayer(spec.layers(i), shapes.inputs[i]));
    layer->Initialize(MixKey({seed, 0x696e6974ULL, static_cast<uint64_t>(i)}));
    for (Parameter* p : layer->Parameters()) {
      model->params_.push_back({absl::StrCat("layers.", i, ".", p->name), p});
      model->param_layers_.push_back(i - begin);
    }
    model->layers_.push_back(std::move(layer));
  }
  return model;
}

Tensor Model::Forward(const Tensor& x, LayerContext ctx,
                      std::vector<Saved>* saved) {
  if (saved != nullptr) saved->assign(layers_.size(), Saved());
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    ctx.layer_index = begin_ + static_cast<int64_t>(i);
    const auto start = std::chrono::steady_clock::now();
    h = layers_[i]->Forward(h, ctx, saved != nullptr ? &(*saved)[i] : nullptr);
    if (timing_ != nullptr) {
      timing_->Finished(static_cast<int64_t>(i), /*backward=*/false,
                        /*record=*/ctx.training && !ctx.recompute, start);
    }
  }
  return h;
}

Tensor Model::Decode(const Tensor& x, int64_t position,
                     std::vector<DecodeState>* states) {
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    h = layers_[i]->Decode(h, position, &(*states)[i]);
  }
  return h;
}

// Each layer in reverse with its context (the first layer takes no input
// gradient), timed as a backward.
template <typename Pass>
void Model::EachLayerBackward(LayerContext ctx, Pass pass) {
  for (size_t i = layers_.size(); i-- > 0;) {
    ctx.layer_index = begin_ + static_cast<int64_t>(i);
    ctx.input_grad = InputGradUsed(ctx.layer_index);
    const auto start = std::chrono::steady_clock::now();
    pass(i, ctx);
    if (timing_ != nullptr) {
      timing_->Finished(static_cast<int64_t>(i), /*backward=*/true,
                        /*record=*/true, start);
    }
  }
}

Tensor Model::Backward(const Tensor& dy, const std::vector<Saved>& saved,
                       LayerContext ctx,
                       const std::function<void(int64_t)>& after_layer) {
  Tensor g = dy;
  EachLayerBackward(ctx, [&](size_t i, const LayerContext& c) {
    g = layers_[i]->Backward(g, saved[i], c);
    if (after_layer) after_layer(static_cast<int64_t>(i));
  });
  return g;
}

Tensor Model::BackwardInput(const Tensor& dy, std::vector<Saved>* saved,
                            LayerContext ctx, std::vector<Saved>* deferred) {
  deferred->assign(layers_.size(), Saved());
  Tensor g = dy;
  EachLayerBackward(ctx, [&](size_t i, const LayerContext& c) {
    g = layers_[i]->BackwardInput(g, (*saved)[i], c, &(*deferred)[i]);
  });
  return g;
}

// The layers' order does not matter for the bits (each adds into its own
// parameters); reverse, as Backward, so the timing and caches see the same.
void Model::BackwardWeight(const std::vector<Saved>& saved,
                           const std::vector<Saved>& deferred, LayerContext ctx,
                           const std::function<void(int64_t)>& after_layer) {
  EachLayerBackward(ctx, [&](size_t i, const LayerContext& c) {
    layers_[i]->BackwardWeight(saved[i], deferred[i], c);
    if (after_layer) after_layer(static_cast<int64_t>(i));
  });
}

Tensor Model::BackwardGrouping(const Tensor& dy, std::vector<Saved>* saved,
                               LayerContext ctx, std::vector<Saved>* deferred) {
  deferred->assign(layers_.size(), Saved());
  Tensor g = dy;
  EachLayerBackward(ctx, [&](size_t i, const LayerContext& c) {
    Layer& layer = *layers_[i];
    if (layer.GroupsWeightHalves()) {
      g = layer.BackwardInput(g, (*saved)[i], c, &(*deferred)[i]);
    } else {
      g = layer.Backward(g, (*saved)[i], c);
      (*saved)[i].Clear();
    }
  });
  return g;
}

void Model::BackwardWeights(std::span<const DeferredWeights> micro_batches,
                            bool every_layer,
                            const std::function<void(int64_t)>& after_layer) {
  if (micro_batches.empty()) return;
  std::vector<WeightHalf> halves(micro_batches.size());
  EachLayerBackward(micro_batches[0].ctx, [&](size_t i, const LayerContext& c) {
    if (every_layer || layers_[i]->GroupsWeightHalves()) {
      for (size_t j = 0; j < micro_batches.size(); ++j) {
        const DeferredWeights& mb = micro_batches[j];
        halves[j].saved = &(*mb.saved)[i];
        halves[j].deferred = &(*mb.deferred)[i];
        halves[j].ctx = mb.ctx;
        halves[j].ctx.layer_index = c.layer_index;
        halves[j].ctx.input_grad = c.input_grad;
      }
      layers_[i]->BackwardWeights(halves);
    }
    if (after_layer) after_layer(static_cast<int64_t>(i));
  });
}

bool Model::GroupsWeightHalves() const {
  for (const auto& layer : layers_)
    if (layer->GroupsWeightHalves()) return true;
  return false;
}

int64_t Model::WeightGroupSize(const std::vector<Saved>& saved, int64_t samples,
                               int64_t as_samples) const {
  std::vector<WeightGroupCost> costs;
  for (size_t i = 0; i < layers_.size() && i < saved.size(); ++i) {
    if (!layers_[i]->GroupsWeightHalves()) continue;
    WeightGroupCost c = layers_[i]->GroupCost(saved[i]);
    if (samples > 0 && as_samples > 0) {
      c.rows = c.rows * as_samples / samples;
      c.held_bytes = c.held_bytes * as_samples / samples;
    }
    costs.push_back(c);
  }
  return gpipe::WeightGroupSize(costs);
}

std::vector<NamedTensor> Model::StateTensors() {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int64_t index = begin_ + static_cast<int64_t>(i);
    for (Parameter* p : layers_[i]->Parameters())
      out.push_back({absl::StrCat("layers.", index, ".", p->name), &p->value});
    for (const NamedBuffer& b : layers_[i]->Buffers())
      out.push_back({absl::StrCat("layers.", index, ".", b.name), b.value});
  }
  return out;
}

absl::Status Model::To(Device device) {
  if (device == Device::kCuda && !CudaAvailable())
    return absl::FailedPreconditionError(CudaDescription());
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]->RunsOn(device)) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", begin_ + static_cast<int64_t>(i), " (",
                       AsAbsl(layers_[i]->kind()), ") has no ",
                       AsAbsl(DeviceName(device)), " kernels yet"));
    }
  }
  // Parameters live as long as the model: not charged to a stage's
  // activation allocator.
  AllocatorScope scope(DefaultAllocator(device));
  for (const NamedParameter& p : params_) {
    p.param->value = p.param->value.To(device);
    p.param->grad = p.param->grad.To(device);
    // Only the CPU's products overwrite an unwritten gradient.
    if (p.param->grad_unwritten && device != Device::kCpu) {
      p.param->grad.SetZero();
      p.param->grad_unwritten = false;
    }
  }
  for (auto& layer : layers_)
    for (const NamedBuffer& b : layer->Buffers())
      *b.value = b.value->To(device);
  // The copies were queued on this thread's stream; a stage computes on its
  // own stream, which does not wait for this one.
  SynchronizeCuda();
  return absl::OkStatus();
}

void Model::ZeroGrad() {
  for (const NamedParameter& p : params_) {
    Parameter& param = *p.param;
    if (param.first_gradient_overwrites &&
        param.grad.device() == Device::kCpu) {
      param.grad_unwritten = true;
    } else {
      param.grad.SetZero();
    }
  }
}

void Model::PackAfterUpdate(size_t i) {
  if (i >= param_layers_.size()) return;
  const int64_t l = param_layers_[i];
  if (i + 1 < param_layers_.size() && param_layers_[i + 1] == l) return;
  layers_[l]->PackWeights(InputGradUsed(begin_ + l));
}

int64_t Model::RunningStatisticsWidth() const {
  int64_t width = 0;
  for (const auto& layer : layers_) width += layer->RunningStatisticsSize();
  return width;
}

absl::StatusOr<Tensor> Model::RunningStatisticsRows(
    const RunningStatistics& log, int64_t begin, int64_t end) const {
  const int64_t width = RunningStatisticsWidth();
  AllocatorScope scope(DefaultCpuAllocator());
  Tensor rows = Tensor::Empty({end - begin, width});
  float* at = rows.f32();
  for (int64_t m = begin; m < end; ++m) {
    for (size_t i = 0; i < layers_.size(); ++i) {
      const int64_t size = layers_[i]->RunningStatisticsSize();
      if (size == 0) continue;
      const int64_t index = begin_ + static_cast<int64_t>(i);
      const Tensor* record = log.Find(m, index);
      if (record == nullptr || record->numel() != size ||
          record->device() != Device::kCpu) {
        return absl::FailedPreconditionError(
            absl::StrCat("layer ", index, " (", std::string(layers_[i]->kind()),
                         ") recorded no statistics for micro-batch ", m,
                         ": its running averages cannot move"));
      }
      at = std::copy(record->f32(), record->f32() + size, at);
    }
  }
  return rows;
}

absl::Status Model::ApplyRunningStatistics(const Tensor& rows) {
  const int64_t width = RunningStatisticsWidth();
  if (!rows.defined() || rows.rank() != 2 || rows.dim(1) != width ||
      rows.device() != Device::kCpu || rows.dtype() != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "running statistics: expected host rows of ", width, " floats"));
  }
  for (int64_t m = 0; m < rows.dim(0); ++m) {
    const float* at = rows.f32() + m * width;
    for (const auto& layer : layers_) {
      const int64_t size = layer->RunningStatisticsSize();
      if (size == 0) continue;
      layer->ApplyRunningStatistics(at);
      at += size;
    }
  }
  return absl::OkStatus();
}

}  // namespace gpipe
