// Per-layer timing (what the self-balancing pipeline re-partitions by):
// which passes count, the warm-up step, and the slowdown that stands for a
// slower machine.
#include "services/nn/layer_timing.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "services/core/memory.h"
#include "services/nn/model.h"

namespace gpipe {
namespace {

std::unique_ptr<Model> Mlp() {
  gpipe::v1::ModelSpec spec;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(R"({
      "input": {"dtype": "FLOAT32", "shape": {"dims": [256]}},
      "layers": [{"linear": {"inFeatures": 256, "outFeatures": 1024}},
                 {"relu": {}},
                 {"linear": {"inFeatures": 1024, "outFeatures": 8}}],
      "loss": {"softmaxCrossEntropy": {}}})",
                                                          &spec)
                  .ok());
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Build(spec, 1);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

// One training pass of `micro_batches` micro-batches through `model`.
// `recomputes` re-materialized forwards per micro-batch.
void Step(Model& model, int micro_batches, int recomputes = 0) {
  for (int m = 0; m < micro_batches; ++m) {
    const Tensor x = Tensor::Filled({64, 256}, 0.5f);
    LayerContext ctx;
    ctx.micro_batch = m;
    std::vector<Saved> saved;
    const Tensor y = model.Forward(x, ctx, &saved);
    for (int r = 0; r < recomputes; ++r) {
      LayerContext again = ctx;
      again.recompute = true;
      model.Forward(x, again, &saved);
    }
    model.Backward(Tensor::Filled({64, 8}, 1.0f), saved, ctx);
  }
}

TEST(LayerTimingTest, TheFirstStepWarmsUpThenEveryLayerHasItsSeconds) {
  // As every binary does at start: freed blocks stay in the heap. Without
  // it a layer's fresh output can be a new mapping faulted in page by page,
  // which made a ReLU's time exceed the linear layer's under ctest here.
  KeepFreedMemory();
  std::unique_ptr<Model> model = Mlp();
  LayerTiming timing(model->size());
  model->set_timing(&timing);
  Step(*model, 2);
  timing.EndStep(2);
  EXPECT_TRUE(timing.forward_seconds().empty());  // warm-up only
  Step(*model, 2);
  timing.EndStep(2);
  ASSERT_EQ(timing.forward_seconds().size(), 3u);
  ASSERT_EQ(timing.backward_seconds().size(), 3u);
  for (int l = 0; l < 3; ++l) {
    EXPECT_GT(timing.forward_seconds()[l], 0) << l;
    EXPECT_GT(timing.backward_seconds()[l], 0) << l;
  }
  // The 256x1024 linear layer (100 MFLOP a step) costs far more than the
  // ReLU after it (64K elements). The
  // fastest of several steps: one step on a loaded machine can be preempted
  // inside the ReLU.
  double linear = timing.forward_seconds()[0] + timing.backward_seconds()[0];
  double relu = timing.forward_seconds()[1] + timing.backward_seconds()[1];
  for (int step = 0; step < 8; ++step) {
    Step(*model, 2);
    timing.EndStep(2);
    linear = std::min(
        linear, timing.forward_seconds()[0] + timing.backward_seconds()[0]);
    relu = std::min(relu,
                    timing.forward_seconds()[1] + timing.backward_seconds()[1]);
  }
  EXPECT_GT(linear, relu);
}

TEST(LayerTimingTest, RematerializationAndEvaluationAreNotCounted) {
  std::unique_ptr<Model> model = Mlp();
  LayerTiming timing(model->size());
  model->set_timing(&timing);
  Step(*model, 1);
  timing.EndStep(1);
  Step(*model, 1);
  timing.EndStep(1);
  const double once = timing.forward_seconds()[0];
  // Ten evaluation passes and ten re-materialized forwards a step: if they
  // counted, the forward estimate would grow about twentyfold.
  for (int i = 0; i < 20; ++i) {
    for (int e = 0; e < 10; ++e) {
      LayerContext eval;
      eval.training = false;
      model->Forward(Tensor::Filled({64, 256}, 0.5f), eval, nullptr);
    }
    Step(*model, 1, /*recomputes=*/10);
    timing.EndStep(1);
  }
  EXPECT_LT(timing.forward_seconds()[0], 5 * once);
}

// Folds one step of one micro-batch in which layer 0's forward took
// `seconds` (as if started that long before now).
void FoldStep(LayerTiming& timing, double seconds) {
  const auto start =
      std::chrono::steady_clock::now() -
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(seconds));
  timing.Finished(0, /*backward=*/false, /*record=*/true, start);
  timing.EndStep(1);
}

TEST(LayerTimingTest, APreemptedStepMovesNothingALastingChangeShows) {
  LayerTiming timing(1);
  FoldStep(timing, 1e-3);  // warm-up
  for (int s = 0; s < 6; ++s) FoldStep(timing, 1e-3);
  // Preempted for 100 ms in one step (a shared machine under load): the
  // estimate stays where the other steps put it.
  FoldStep(timing, 0.1);
  EXPECT_LT(timing.forward_seconds()[0], 2e-3);
  // A few more such steps, fewer than half the window: still nothing.
  for (int s = 0; s < LayerTiming::kWindowSteps / 2 - 1; ++s)
    FoldStep(timing, 0.1);
  EXPECT_LT(timing.forward_seconds()[0], 2e-3);
  // The layer really became slower (a slower worker, a larger input):
  // within half the window the estimate is the new time.
  for (int s = 0; s < LayerTiming::kWindowSteps / 2 + 1; ++s)
    FoldStep(timing, 20e-3);
  EXPECT_GE(timing.forward_seconds()[0], 20e-3);
  EXPECT_LT(timing.forward_seconds()[0], 0.1);
}

TEST(LayerTimingTest, ASlowdownSleepsWhatItCounts) {
  std::unique_ptr<Model> model = Mlp();
  LayerTiming timing(model->size(), /*slowdown=*/4.0);
  model->set_timing(&timing);
  Step(*model, 1);
  timing.EndStep(1);
  const auto start = std::chrono::steady_clock::now();
  Step(*model, 8);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  timing.EndStep(8);
  double counted = 0;  // the step's 8 micro-batches as recorded
  for (int l = 0; l < 3; ++l) {
    counted += 8 * (timing.forward_seconds()[l] + timing.backward_seconds()[l]);
  }
  // Each layer counts 4x its compute and the difference is slept, all but
  // what is still owed (under 1 ms) and what an earlier sleep overslept on
  // a loaded machine (taken off this step's sleeps).
  EXPECT_GE(wall, 0.75 * counted);
  EXPECT_GT(counted, 0);
}

}  // namespace
}  // namespace gpipe
