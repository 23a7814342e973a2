// The stage figures on gpipectl's progress bar: the schedule's theory on
// equal stages, and each worker's bubble the cost model predicts for the
// cut it runs.
#include <string>
#include <vector>

#include "cli/stage_figures.h"
#include "gtest/gtest.h"
#include "services/pipeline/simulator.h"

namespace gpipe::cli {
namespace {

// Four equal Linears and a 10-wide head, as the main job's model: at K=2
// the first stage holds the model's first layer, which makes no input
// gradient, so it idles more than the second.
gpipe::v1::JobSpec DeepMlp() {
  gpipe::v1::JobSpec spec;
  gpipe::v1::ModelSpec& m = *spec.mutable_model();
  m.mutable_input()->set_dtype(gpipe::v1::FLOAT32);
  m.mutable_input()->mutable_shape()->add_dims(784);
  for (int i = 0; i < 4; ++i) {
    auto* l = m.add_layers()->mutable_linear();
    l->set_in_features(784);
    l->set_out_features(784);
    m.add_layers()->mutable_relu();
  }
  auto* head = m.add_layers()->mutable_linear();
  head->set_in_features(784);
  head->set_out_features(10);
  m.mutable_loss()->mutable_softmax_cross_entropy();
  spec.set_batch_size(128);
  spec.mutable_optimizer()->set_lr(0.01f);
  return spec;
}

TEST(StageFigures, TheoryAlone) {
  EXPECT_EQ(BubbleTheoryText(ScheduleKind::kGPipe, 2, 4, 1),
            " (gpipe theory 20%)");
  EXPECT_EQ(BubbleTheoryText(ScheduleKind::kZeroBubbleH1, 2, 8, 1),
            " (zb-h1 theory 4%)");
  EXPECT_EQ(BubbleTheoryText(ScheduleKind::kGPipe, 1, 4, 1), "");
  // Figures for another number of workers are left out.
  EXPECT_EQ(BubbleTheoryText(ScheduleKind::kGPipe, 2, 4, 1, {0.3}),
            " (gpipe theory 20%)");
}

TEST(StageFigures, TheoryAndTheCut) {
  EXPECT_EQ(
      BubbleTheoryText(ScheduleKind::kZeroBubbleH1, 2, 8, 1, {0.164, 0.057}),
      " (zb-h1 theory 4%, this cut 16% 6%)");
  EXPECT_EQ(StageFiguresLine({{0.82, 0.18}, {0.95, 0.05}},
                             BubbleTheoryText(ScheduleKind::kZeroBubbleH1, 2, 8,
                                              1, {0.164, 0.057})),
            "util 82% 95%  bubble 18% 5% (zb-h1 theory 4%, this cut 16% 6%)");
}

TEST(StageFigures, TheCutsBubbleIsTheCostModelsSimulation) {
  const gpipe::v1::JobSpec spec = DeepMlp();
  const std::vector<int64_t> balance = {4, 5};
  const std::vector<double> cut = CutBubbles(
      spec, ScheduleKind::kZeroBubbleH1, RematMode::kNever, balance, 8, 1, 128);
  ASSERT_EQ(cut.size(), 2u);
  auto shapes = InferModelShapes(spec.model());
  ASSERT_TRUE(shapes.ok());
  const SimulationResult sim = CostModelSimulation(
      *shapes, balance, 8, ScheduleKind::kZeroBubbleH1, 1, RematMode::kNever,
      128, UpdateTraffic(spec.optimizer()));
  EXPECT_EQ(cut[0], sim.stages[0].bubble_fraction);
  EXPECT_EQ(cut[1], sim.stages[1].bubble_fraction);
  // The first stage, with the layer that makes no input gradient, idles
  // more than the second and more than the schedule's theory.
  EXPECT_GT(cut[0], cut[1]);
  EXPECT_GT(cut[0], TheoreticalBubble(ScheduleKind::kZeroBubbleH1, 2, 8));

  // ZB-V: one figure per worker, not per chunk.
  const std::vector<double> v =
      CutBubbles(spec, ScheduleKind::kZeroBubbleV, RematMode::kNever,
                 {2, 2, 2, 3}, 8, 2, 128);
  EXPECT_EQ(v.size(), 2u);
}

TEST(StageFigures, NoFiguresForACutThatDoesNotFit) {
  const gpipe::v1::JobSpec spec = DeepMlp();
  // Too few layers, an empty stage, a shape the schedule refuses.
  EXPECT_TRUE(CutBubbles(spec, ScheduleKind::kGPipe, RematMode::kNever, {4, 4},
                         4, 1, 128)
                  .empty());
  EXPECT_TRUE(CutBubbles(spec, ScheduleKind::kGPipe, RematMode::kNever, {9, 0},
                         4, 1, 128)
                  .empty());
  EXPECT_TRUE(CutBubbles(spec, ScheduleKind::kInterleaved1F1B,
                         RematMode::kNever, {3, 3, 3}, 4, 2, 128)
                  .empty());
  gpipe::v1::JobSpec broken = spec;
  broken.mutable_model()->mutable_layers(0)->mutable_linear()->set_in_features(
      5);
  EXPECT_TRUE(CutBubbles(broken, ScheduleKind::kGPipe, RematMode::kNever,
                         {4, 5}, 4, 1, 128)
                  .empty());
}

}  // namespace
}  // namespace gpipe::cli
