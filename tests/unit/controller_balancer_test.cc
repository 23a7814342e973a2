// The balancer's arithmetic: layer costs and worker speeds from what the
// stages measured, and the cut (and worker order) it proposes, or not.
#include <string>
#include <vector>

#include "controller/balancer.h"
#include "gtest/gtest.h"
#include "services/nn/layer_spec.h"
#include "tests/support/controller_fixtures.h"

namespace gpipe::controller {
namespace {

// A model of `n` equal layers (Linear 32 -> 32), for the simulator's bytes.
ModelShapes EqualLayers(int n) {
  gpipe::v1::JobSpec spec = test_support::ControllerSpec(2);
  gpipe::v1::ModelSpec* model = spec.mutable_model();
  model->clear_layers();
  model->mutable_input()->mutable_shape()->clear_dims();
  model->mutable_input()->mutable_shape()->add_dims(32);
  for (int i = 0; i < n; ++i) {
    auto* linear = model->add_layers()->mutable_linear();
    linear->set_in_features(32);
    linear->set_out_features(32);
  }
  absl::StatusOr<ModelShapes> shapes = InferModelShapes(*model);
  EXPECT_TRUE(shapes.ok()) << shapes.status();
  return *shapes;
}

// Each stage's layers as `worker` measured them: `seconds` forward, twice
// that backward, per layer.
void Measure(LayerCostBook& book, const std::vector<int64_t>& balance,
             const std::vector<std::string>& workers,
             const std::vector<double>& seconds) {
  int64_t begin = 0;
  for (size_t s = 0; s < balance.size(); ++s) {
    std::vector<LayerSeconds> layers;
    for (int64_t l = begin; l < begin + balance[s]; ++l) {
      layers.push_back({seconds[l], 2 * seconds[l]});
    }
    book.Record(workers[s], begin, layers);
    begin += balance[s];
  }
}

RebalanceInput Input(const ModelShapes& shapes, std::vector<int64_t> balance,
                     std::vector<std::string> workers,
                     const LayerCostBook& book) {
  RebalanceInput in;
  in.shapes = &shapes;
  in.micro_batches = 8;
  in.micro_batch_size = 4;
  in.schedule = ScheduleKind::kGPipe;
  in.remat = RematMode::kNever;
  in.balance = std::move(balance);
  in.workers = std::move(workers);
  in.costs = EstimateCosts(book, static_cast<int64_t>(shapes.costs.size()));
  return in;
}

TEST(BalancerTest, OneMeasurementPerLayerLeavesTheSpeedsEqual) {
  LayerCostBook book;
  Measure(book, {2, 2}, {"a", "b"}, {1, 1, 4, 4});
  const CostEstimate c = EstimateCosts(book, 4);
  ASSERT_TRUE(c.complete);
  EXPECT_DOUBLE_EQ(c.speed.at("a"), 1.0);
  EXPECT_DOUBLE_EQ(c.speed.at("b"), 1.0);
  EXPECT_DOUBLE_EQ(c.layers[2].forward, 4.0);
  EXPECT_DOUBLE_EQ(c.layers[2].backward, 8.0);
  EXPECT_FALSE(EstimateCosts(book, 5).complete);  // layer 4 never ran
}

TEST(BalancerTest, ALayerSeenOnTwoWorkersTellsTheirSpeedsApart) {
  // Every layer costs 1; worker b is three times slower. Layers 2..3 ran on
  // b first, then (after a move) layer 2 ran on a.
  LayerCostBook book;
  Measure(book, {2, 2}, {"a", "b"}, {1, 1, 3, 3});
  Measure(book, {3, 1}, {"a", "b"}, {1, 1, 1, 3});
  const CostEstimate c = EstimateCosts(book, 4);
  EXPECT_NEAR(c.speed.at("a") / c.speed.at("b"), 3.0, 1e-6);
  // Costs at speed 1 are equal across layers once the speeds are known.
  for (int l = 1; l < 4; ++l) {
    EXPECT_NEAR(c.layers[l].total() / c.layers[0].total(), 1.0, 1e-6) << l;
  }
}

TEST(BalancerTest, RepeatedLayersTellSpeedsApartAtOnce) {
  // Two workers, each with two layers of the same class (0, 1 | 0, 1):
  // worker b measures both 3x longer, so it is 3x slower, not its layers
  // dearer.
  LayerCostBook book;
  Measure(book, {2, 2}, {"a", "b"}, {1, 2, 3, 6});
  CostEstimate c = EstimateCosts(book, {0, 1, 0, 1});
  EXPECT_NEAR(c.speed.at("a") / c.speed.at("b"), 3.0, 1e-6);
  EXPECT_NEAR(c.layers[2].total() / c.layers[0].total(), 1.0, 1e-6);
  EXPECT_NEAR(c.layers[1].total() / c.layers[0].total(), 2.0, 1e-6);
  // Layers split from a stage's busy time (a GPU stage) do not link.
  LayerCostBook split;
  split.Record("a", 0, LayerSecondsFromBusy(3, 1, false, {1, 2}));
  split.Record("b", 2, LayerSecondsFromBusy(9, 1, false, {1, 2}));
  c = EstimateCosts(split, {0, 1, 0, 1});
  EXPECT_NEAR(c.speed.at("a") / c.speed.at("b"), 1.0, 1e-9);
  EXPECT_NEAR(c.layers[2].total() / c.layers[0].total(), 3.0, 1e-9);
  // The classes of a model: the same spec on the same input shape.
  const ModelShapes shapes = EqualLayers(3);
  gpipe::v1::ModelSpec model = test_support::ControllerSpec(2).model();
  model.clear_layers();
  model.mutable_input()->mutable_shape()->clear_dims();
  model.mutable_input()->mutable_shape()->add_dims(32);
  for (int i = 0; i < 3; ++i) {
    auto* linear = model.add_layers()->mutable_linear();
    linear->set_in_features(32);
    linear->set_out_features(i < 2 ? 32 : 8);
  }
  absl::StatusOr<ModelShapes> s = InferModelShapes(model);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(LayerClasses(model, *s), (std::vector<int64_t>{0, 0, 1}));
}

TEST(BalancerTest, ProbesSetTheSpeedsMeasurementsDoNotLink) {
  // No layer class on both workers: the start-up probes (30 and 10
  // GFLOP/s) say b is 3x slower, so b's layers are 3x cheaper than they
  // measured.
  LayerCostBook book;
  book.Record("a", 0, {{1, 2}, {1, 2}}, 30);
  book.Record("b", 2, {{3, 6}, {3, 6}}, 10);
  CostEstimate c = EstimateCosts(book, 4);
  EXPECT_NEAR(c.speed.at("a") / c.speed.at("b"), 3.0, 1e-9);
  EXPECT_NEAR(c.layers[2].total() / c.layers[0].total(), 1.0, 1e-9);
  // Where a class links them, the measurements win over the probes.
  c = EstimateCosts(book, {0, 1, 0, 1});
  EXPECT_NEAR(c.speed.at("a") / c.speed.at("b"), 3.0, 1e-9);
  LayerCostBook equal;
  equal.Record("a", 0, {{1, 2}, {1, 2}}, 30);
  equal.Record("b", 2, {{1, 2}, {1, 2}}, 10);
  c = EstimateCosts(equal, {0, 1, 0, 1});
  EXPECT_NEAR(c.speed.at("a") / c.speed.at("b"), 1.0, 1e-9);
}

// 12 equal layers (`shapes`) cut 4,4,4 on workers a, b, c, where stage 1's
// worker is 4x slower, which the first measurements show as expensive
// layers.
RebalanceInput SlowMiddleStage(const ModelShapes& shapes) {
  LayerCostBook book;
  std::vector<double> seconds(12, 1e-3);
  for (int l = 4; l < 8; ++l) seconds[l] = 4e-3;
  Measure(book, {4, 4, 4}, {"a", "b", "c"}, seconds);
  return Input(shapes, {4, 4, 4}, {"a", "b", "c"}, book);
}

TEST(BalancerTest, ASlowStageGivesUpLayers) {
  const ModelShapes shapes = EqualLayers(12);
  RebalanceInput in = SlowMiddleStage(shapes);
  const std::optional<RebalanceProposal> p = ProposeRebalance(in);
  ASSERT_TRUE(p.has_value());
  EXPECT_LT(p->balance[1], 4);
  EXPECT_EQ(p->workers, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(p->reason, "layer_costs");
  EXPECT_LT(p->predicted_new_seconds, 0.9 * p->predicted_old_seconds);
  EXPECT_DOUBLE_EQ(p->predicted_old_seconds,
                   PredictStepSeconds(in, in.balance, in.workers));

  // The same cut is not proposed again once it has run ...
  in.tried.insert(CutKey(p->balance, p->workers));
  EXPECT_FALSE(ProposeRebalance(in).has_value());
  // ... nor one that does not fit its workers' memory.
  in.tried.clear();
  in.fits = [](const std::vector<int64_t>&, const std::vector<std::string>&) {
    return false;
  };
  EXPECT_FALSE(ProposeRebalance(in).has_value());
}

TEST(BalancerTest, LayerTimesLongerThanTheirStepJudgeNothing) {
  // Stage 1's layers measured 4x the others'. Whether they are evidence
  // depends on the step measured around them: one much shorter than their
  // compute says that they were taken on a disturbed machine (layers
  // preempted mid-way).
  const ModelShapes shapes = EqualLayers(12);
  RebalanceInput in = SlowMiddleStage(shapes);
  const double predicted = PredictStepSeconds(in, in.balance, in.workers);
  // A step as long as the compute the layers claim, or a little shorter:
  // judged, and stage 1 gives up layers.
  in.measured_step_seconds = predicted;
  std::string why;
  EXPECT_TRUE(ProposeRebalance(in, &why).has_value()) << why;
  in.measured_step_seconds = predicted / 1.4;
  EXPECT_TRUE(ProposeRebalance(in, &why).has_value()) << why;
  // Under two thirds of it: no proposal, and why says so.
  in.measured_step_seconds = predicted / 1.6;
  EXPECT_FALSE(ProposeRebalance(in, &why).has_value());
  EXPECT_NE(why.find("more than its whole"), std::string::npos) << why;
  EXPECT_NE(why.find("disturbed"), std::string::npos) << why;
}

TEST(BalancerTest, ABalancedCutStays) {
  const ModelShapes shapes = EqualLayers(12);
  LayerCostBook book;
  std::vector<double> seconds(12, 1e-3);
  seconds[5] = 1.05e-3;  // noise well under min_gain
  Measure(book, {4, 4, 4}, {"a", "b", "c"}, seconds);
  EXPECT_FALSE(ProposeRebalance(Input(shapes, {4, 4, 4}, {"a", "b", "c"}, book))
                   .has_value());
}

TEST(BalancerTest, KnownSpeedsPutTheFastWorkerOnTheHeavyLayers) {
  // Layers 0..1 are expensive (cost 4), 2..7 cheap (cost 1). Worker a is
  // 4x slower than b, which the book knows from layer 3 running on both.
  // Whatever the cut, a stage 0 on a takes 48 ms for one heavy layer; with
  // b first the step can take 36.
  const ModelShapes shapes = EqualLayers(8);
  LayerCostBook book;
  const auto on = [](const std::string& w, int l) {
    return (l < 2 ? 4e-3 : 1e-3) * (w == "a" ? 4 : 1);
  };
  std::vector<double> first(8), second(8);
  for (int l = 0; l < 8; ++l) first[l] = on(l < 4 ? "a" : "b", l);
  Measure(book, {4, 4}, {"a", "b"}, first);
  for (int l = 0; l < 8; ++l) second[l] = on(l < 3 ? "a" : "b", l);
  Measure(book, {3, 5}, {"a", "b"}, second);
  RebalanceInput in = Input(shapes, {3, 5}, {"a", "b"}, book);
  EXPECT_NEAR(in.costs.speed.at("b") / in.costs.speed.at("a"), 4.0, 1e-6);
  const std::optional<RebalanceProposal> p = ProposeRebalance(in);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->reason, "worker_speeds");
  EXPECT_EQ(p->workers, (std::vector<std::string>{"b", "a"}));
  EXPECT_LT(p->predicted_new_seconds,
            PredictStepSeconds(in, {1, 7}, {"a", "b"}));
}

TEST(BalancerTest, TheSameCutOnOtherWorkersIsANewCut) {
  // Four heavy layers then four light ones; a's probe says it is 4x
  // slower than b. The best is the running 4,4 with the workers swapped,
  // which the running cut's having run does not rule out.
  const ModelShapes shapes = EqualLayers(8);
  LayerCostBook book;
  std::vector<LayerSeconds> heavy(4, {16e-3, 32e-3}), light(4, {1e-3, 2e-3});
  book.Record("a", 0, heavy, 10);
  book.Record("b", 4, light, 40);
  RebalanceInput in = Input(shapes, {4, 4}, {"a", "b"}, book);
  in.tried.insert(CutKey({4, 4}, {"a", "b"}));
  const std::optional<RebalanceProposal> p = ProposeRebalance(in);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->balance, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(p->workers, (std::vector<std::string>{"b", "a"}));
}

TEST(BalancerTest, BusyTimeSplitsByTheCostModel) {
  // busy 12 s over 2 micro-batches, no remat: F = 12 / 2 / 3 = 2 s split
  // 1:3, backward twice the forward.
  std::vector<LayerSeconds> s = LayerSecondsFromBusy(12, 2, false, {1, 3});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_DOUBLE_EQ(s[0].forward, 0.5);
  EXPECT_DOUBLE_EQ(s[1].forward, 1.5);
  EXPECT_DOUBLE_EQ(s[1].backward, 3.0);
  // Re-materializing: the forward counts twice, F = 12 / 2 / 4.
  s = LayerSecondsFromBusy(12, 2, true, {1, 3});
  EXPECT_DOUBLE_EQ(s[0].forward + s[1].forward, 1.5);
}

TEST(BalancerTest, UpdatesSplitByParameterBytes) {
  std::vector<LayerSeconds> layers(3);
  AddUpdateSeconds(0.006, {100, 0, 200}, layers);
  EXPECT_DOUBLE_EQ(layers[0].update, 0.002);
  EXPECT_DOUBLE_EQ(layers[1].update, 0.0);
  EXPECT_DOUBLE_EQ(layers[2].update, 0.004);
  EXPECT_DOUBLE_EQ(layers[0].total(), 0.0);  // not a per-micro-batch time
  std::vector<LayerSeconds> none(2);
  AddUpdateSeconds(0.002, {0, 0}, none);
  EXPECT_DOUBLE_EQ(none[0].update, 0.001);
  EXPECT_DOUBLE_EQ(none[1].update, 0.001);
}

TEST(BalancerTest, ThePredictedStepEndsWithTheUpdates) {
  // 4 equal layers on 2 stages, GPipe: the first stage finishes last, so
  // its update (2 layers x 5 ms) is the step's last 10 ms; the last
  // stage's (2 x 1 ms) runs beside it.
  const ModelShapes shapes = EqualLayers(4);
  LayerCostBook plain, updating;
  Measure(plain, {2, 2}, {"a", "b"}, {1e-3, 1e-3, 1e-3, 1e-3});
  const std::vector<double> update = {5e-3, 5e-3, 1e-3, 1e-3};
  for (int64_t s = 0; s < 2; ++s) {
    std::vector<LayerSeconds> layers;
    for (int64_t l = 2 * s; l < 2 * s + 2; ++l)
      layers.push_back({1e-3, 2e-3, false, update[l]});
    updating.Record(s == 0 ? "a" : "b", 2 * s, layers);
  }
  const RebalanceInput a = Input(shapes, {2, 2}, {"a", "b"}, plain);
  const RebalanceInput b = Input(shapes, {2, 2}, {"a", "b"}, updating);
  EXPECT_DOUBLE_EQ(b.costs.layers[0].update, 5e-3);
  EXPECT_NEAR(PredictStepSeconds(b, {2, 2}, {"a", "b"}) -
                  PredictStepSeconds(a, {2, 2}, {"a", "b"}),
              10e-3, 1e-9);
}

TEST(BalancerTest, TheBookForgetsTheLeastRecentWorkers) {
  LayerCostBook book;
  for (int w = 0; w < 70; ++w) {
    book.Record("w" + std::to_string(w), 0, {{1, 2}});
  }
  EXPECT_EQ(book.seen().size(), 64u);
  EXPECT_EQ(book.seen().count({0, "w0"}), 0u);
  EXPECT_EQ(book.seen().count({0, "w69"}), 1u);
}

}  // namespace
}  // namespace gpipe::controller
