#include "worker/speed_probe.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <vector>

#include "services/core/status.h"
#include "services/nn/layer_timing.h"
#include "services/nn/model.h"

namespace gpipe {
namespace {

// Two Linear 512 -> 512 layers on 128 samples: large enough to run at a
// GEMM's speed, small enough that one pass takes about a millisecond.
constexpr int64_t kWidth = 512;
constexpr int64_t kBatch = 128;
constexpr int kLayers = 2;
constexpr int kWindows = 3;

gpipe::v1::ModelSpec ProbeModel() {
  gpipe::v1::ModelSpec spec;
  spec.mutable_input()->set_dtype(gpipe::v1::FLOAT32);
  spec.mutable_input()->mutable_shape()->add_dims(kWidth);
  for (int i = 0; i < kLayers; ++i) {
    gpipe::v1::Linear* linear = spec.add_layers()->mutable_linear();
    linear->set_in_features(kWidth);
    linear->set_out_features(kWidth);
  }
  spec.mutable_loss()->mutable_softmax_cross_entropy();
  return spec;
}

}  // namespace

absl::StatusOr<double> ProbeComputeSpeed(double slowdown, double min_seconds) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   Model::Build(ProbeModel(), /*seed=*/1));
  LayerTiming timing(model->size(), slowdown);
  model->set_timing(&timing);
  const Tensor x = Tensor::Filled({kBatch, kWidth}, 0.5f);
  const Tensor dy = Tensor::Filled({kBatch, kWidth}, 1e-3f);
  // A forward and a backward (input and weight gradients): three GEMMs of
  // 2 * batch * width^2 each per layer.
  const double flops_per_pass =
      3.0 * 2.0 * kBatch * kWidth * kWidth * static_cast<double>(kLayers);
  const auto pass = [&] {
    std::vector<Saved> saved;
    const Tensor y = model->Forward(x, LayerContext(), &saved);
    model->Backward(dy, saved, LayerContext());
    model->ZeroGrad();
  };
  pass();  // warm-up: allocations, the BLAS threads
  // The best of a few windows: a neighbour starting up at the same moment
  // slows one window, not all; each window is long enough (about a CPU
  // quota period) that throttling shows in every one.
  double best = 0;
  for (int w = 0; w < kWindows; ++w) {
    const auto start = std::chrono::steady_clock::now();
    int64_t passes = 0;
    double seconds = 0;
    do {
      pass();
      ++passes;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                              start)
                    .count();
    } while (seconds < min_seconds / kWindows);
    best = std::max(
        best, flops_per_pass * static_cast<double>(passes) / seconds / 1e9);
  }
  return best;
}

}  // namespace gpipe
