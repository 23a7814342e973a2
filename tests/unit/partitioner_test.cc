// The partitioner is exact: on every small cost vector its split has the
// smallest possible most-expensive stage and, among those, the smallest
// variance, as found by trying every split. Explicit balances override it.
#include "services/pipeline/partitioner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/core/memory.h"
#include "services/core/rng.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/layer_profile.h"
#include "services/pipeline/simulator.h"

namespace gpipe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Stage costs summed directly, independent of the partitioner's prefix sums.
std::vector<double> StageSums(const std::vector<double>& costs,
                              const std::vector<int64_t>& balance) {
  std::vector<double> sums;
  size_t l = 0;
  for (int64_t b : balance) {
    double s = 0;
    for (int64_t i = 0; i < b; ++i) s += costs[l++];
    sums.push_back(s);
  }
  return sums;
}

double MaxOf(const std::vector<double>& v) {
  return *std::max_element(v.begin(), v.end());
}

double VarianceOf(const std::vector<double>& v) {
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double sq = 0;
  for (double x : v) sq += (x - mean) * (x - mean);
  return sq / v.size();
}

// Every way to cut n layers into k non-empty contiguous stages.
void AllBalances(int64_t n, int64_t k, std::vector<int64_t>& prefix,
                 std::vector<std::vector<int64_t>>& out) {
  if (k == 1) {
    prefix.push_back(n);
    out.push_back(prefix);
    prefix.pop_back();
    return;
  }
  for (int64_t first = 1; first <= n - (k - 1); ++first) {
    prefix.push_back(first);
    AllBalances(n - first, k - 1, prefix, out);
    prefix.pop_back();
  }
}

struct BruteForce {
  double min_max;
  double min_variance;  // among the splits that reach min_max
};

BruteForce Solve(const std::vector<double>& costs, int64_t k, double tol) {
  std::vector<std::vector<int64_t>> all;
  std::vector<int64_t> prefix;
  AllBalances(static_cast<int64_t>(costs.size()), k, prefix, all);
  BruteForce best{std::numeric_limits<double>::infinity(),
                  std::numeric_limits<double>::infinity()};
  for (const auto& b : all)
    best.min_max = std::min(best.min_max, MaxOf(StageSums(costs, b)));
  for (const auto& b : all) {
    const std::vector<double> sums = StageSums(costs, b);
    if (MaxOf(sums) <= best.min_max + tol) {
      best.min_variance = std::min(best.min_variance, VarianceOf(sums));
    }
  }
  return best;
}

void ExpectOptimal(const std::vector<double>& costs, int64_t k) {
  const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
  const double tol = 1e-9 * std::max(1.0, total);
  absl::StatusOr<std::vector<int64_t>> balance = PartitionByCost(costs, k);
  ASSERT_TRUE(balance.ok()) << balance.status();
  ASSERT_EQ(balance->size(), static_cast<size_t>(k));
  int64_t layers = 0;
  for (int64_t b : *balance) {
    EXPECT_GE(b, 1);
    layers += b;
  }
  ASSERT_EQ(layers, static_cast<int64_t>(costs.size()));
  const std::vector<double> sums = StageSums(costs, *balance);
  const BruteForce best = Solve(costs, k, tol);
  EXPECT_NEAR(MaxOf(sums), best.min_max, tol) << "k=" << k;
  EXPECT_NEAR(VarianceOf(sums), best.min_variance, tol * std::max(1.0, total))
      << "k=" << k;
}

TEST(PartitionByCostTest, MatchesBruteForceOnSmallIntegerCosts) {
  // Small integers tie often, so the variance tie-break is exercised.
  Rng rng(1);
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng.Below(9));
    std::vector<double> costs(n);
    for (double& c : costs) c = static_cast<double>(rng.Below(6));
    for (int64_t k = 1; k <= n; ++k) ExpectOptimal(costs, k);
  }
}

TEST(PartitionByCostTest, MatchesBruteForceOnRealCosts) {
  Rng rng(2);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng.Below(9));
    std::vector<double> costs(n);
    for (double& c : costs) c = rng.Uniform() * std::pow(10.0, rng.Below(4));
    for (int64_t k = 1; k <= n; ++k) ExpectOptimal(costs, k);
  }
}

TEST(PartitionByCostTest, HandMadeCases) {
  EXPECT_THAT(*PartitionByCost({1, 1, 1, 1}, 2), ElementsAre(2, 2));
  EXPECT_THAT(*PartitionByCost({4, 1, 1, 1, 1}, 2), ElementsAre(1, 4));
  EXPECT_THAT(*PartitionByCost({5, 5, 5}, 3), ElementsAre(1, 1, 1));
  EXPECT_THAT(*PartitionByCost({1, 2, 3}, 1), ElementsAre(3));
  // Several splits reach max 10 ({10 | 1 1 1 1 | 1 5} too); the variance
  // tie-break picks the evenest rest.
  const std::vector<int64_t> b = *PartitionByCost({10, 1, 1, 1, 1, 1, 5}, 3);
  EXPECT_THAT(StageSums({10, 1, 1, 1, 1, 1, 5}, b), ElementsAre(10, 5, 5));
  EXPECT_THAT(*PartitionByCost({3, 3, 3, 3, 3, 3, 3}, 3),
              ::testing::AnyOf(ElementsAre(2, 2, 3), ElementsAre(2, 3, 2),
                               ElementsAre(3, 2, 2)));
  // Zero-cost layers are fine; every stage still gets one.
  EXPECT_THAT(*PartitionByCost({0, 0, 0}, 3), ElementsAre(1, 1, 1));
}

// The model's first layer computes no input gradient, so the first stage
// does one forward of it less: of five equal layers at 3 units a layer, the
// first stage takes three (8 against 6), where without it 2 | 3 and 3 | 2
// both cost 9.
TEST(PartitionByCostTest, TheFirstStageSkipsItsFirstLayersInputHalf) {
  const std::vector<double> five(5, 1.0);
  EXPECT_THAT(*PartitionByCost(five, 2, {3, 3}, true), ElementsAre(3, 2));
  // 5, 6, 3 or 5, 3, 6 (the same squares), never 1 | 2 | 2 (2, 6, 6).
  EXPECT_THAT(*PartitionByCost(five, 3, {3, 3, 3}, true),
              ::testing::AnyOf(ElementsAre(2, 2, 1), ElementsAre(2, 1, 2)));
  // Re-materializing stages count 4 a layer: 4 + 4 - 1 against 3 x 3.
  EXPECT_THAT(*PartitionByCost(five, 2, {4, 3}, true), ElementsAre(2, 3));
  // Weights under one forward a layer cannot pay for the skipped half.
  EXPECT_FALSE(PartitionByCost(five, 2, {0.5, 3}, true).ok());
  EXPECT_TRUE(PartitionByCost(five, 2, {0.5, 3}, false).ok());
}

TEST(PartitionByCostTest, WeightedStagesMinimizeTheWeightedMaximum) {
  Rng rng(3);
  const double choices[] = {1.0, 1.5, 3.0, 4.0};
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng.Below(8));
    std::vector<double> costs(n);
    for (double& c : costs) c = static_cast<double>(rng.Below(7));
    for (int64_t k = 1; k <= n; ++k) {
      std::vector<double> w(k);
      for (double& x : w) x = choices[rng.Below(4)];
      const auto weighted_max = [&](const std::vector<int64_t>& b) {
        const std::vector<double> sums = StageSums(costs, b);
        double m = 0;
        for (int64_t s = 0; s < k; ++s) m = std::max(m, w[s] * sums[s]);
        return m;
      };
      absl::StatusOr<std::vector<int64_t>> balance =
          PartitionByCost(costs, k, w);
      ASSERT_TRUE(balance.ok()) << balance.status();
      std::vector<std::vector<int64_t>> all;
      std::vector<int64_t> prefix;
      AllBalances(n, k, prefix, all);
      double best = std::numeric_limits<double>::infinity();
      for (const auto& b : all) best = std::min(best, weighted_max(b));
      EXPECT_DOUBLE_EQ(weighted_max(*balance), best) << "n=" << n << " k=" << k;
    }
  }
}

TEST(PartitionByStageCostTest, MatchesBruteForceForAnyStageCost) {
  // The balancer's costs: a forward and a backward per layer, a stage that
  // re-materializes counting its forward twice, each stage on a worker of
  // its own speed.
  Rng rng(4);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng.Below(8));
    std::vector<double> f(n), b(n);
    for (int64_t l = 0; l < n; ++l) {
      f[l] = rng.Uniform();
      b[l] = 2 * f[l] * (0.5 + rng.Uniform());
    }
    for (int64_t k = 1; k <= n; ++k) {
      std::vector<double> speed(k);
      std::vector<bool> remat(k);
      for (int64_t s = 0; s < k; ++s) {
        speed[s] = 0.25 + rng.Uniform();
        remat[s] = rng.Below(2) == 1;
      }
      const auto cost = [&](int64_t s, int64_t begin, int64_t end) {
        double t = 0;
        for (int64_t l = begin; l < end; ++l)
          t += (remat[s] ? 2 : 1) * f[l] + b[l];
        return t / speed[s];
      };
      const auto max_of = [&](const std::vector<int64_t>& balance) {
        double m = 0;
        int64_t begin = 0;
        for (int64_t s = 0; s < k; ++s) {
          m = std::max(m, cost(s, begin, begin + balance[s]));
          begin += balance[s];
        }
        return m;
      };
      absl::StatusOr<std::vector<int64_t>> balance =
          PartitionByStageCost(n, k, cost);
      ASSERT_TRUE(balance.ok()) << balance.status();
      std::vector<std::vector<int64_t>> all;
      std::vector<int64_t> prefix;
      AllBalances(n, k, prefix, all);
      double best = std::numeric_limits<double>::infinity();
      for (const auto& x : all) best = std::min(best, max_of(x));
      EXPECT_NEAR(max_of(*balance), best, 1e-12) << "n=" << n << " k=" << k;
    }
  }
  EXPECT_FALSE(PartitionByStageCost(3, 4, [](int64_t, int64_t, int64_t) {
                 return 1.0;
               }).ok());
}

TEST(PartitionByCostTest, StagesThatRematerializeGetFewerLayers) {
  EXPECT_THAT(RematStageWeights(RematMode::kExceptLast, 3),
              ElementsAre(4, 4, 3));
  EXPECT_THAT(RematStageWeights(RematMode::kAlways, 2), ElementsAre(4, 4));
  EXPECT_THAT(RematStageWeights(RematMode::kNever, 2), ElementsAre(3, 3));
  // Seven equal layers on two stages: the first re-materializes (4 units a
  // layer against the last stage's 3), so it takes 3 and the last 4.
  const std::vector<double> seven(7, 1.0);
  EXPECT_THAT(
      *PartitionByCost(seven, 2, RematStageWeights(RematMode::kExceptLast, 2)),
      ElementsAre(3, 4));
  EXPECT_THAT(
      *PartitionByCost(seven, 2, RematStageWeights(RematMode::kAlways, 2)),
      ::testing::AnyOf(ElementsAre(3, 4), ElementsAre(4, 3)));
  EXPECT_THAT(PartitionByCost(seven, 2, {1.0}).status().message(),
              HasSubstr("1 for 2 stages"));
  EXPECT_THAT(PartitionByCost(seven, 2, {1.0, 0.0}).status().message(),
              HasSubstr("finite and > 0"));
}

TEST(PartitionByCostTest, ManyLayersAndStagesAreQuick) {
  std::vector<double> costs(2000);
  Rng rng(3);
  for (double& c : costs) c = 1 + rng.Uniform();
  absl::StatusOr<std::vector<int64_t>> b = PartitionByCost(costs, 128);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->size(), 128u);
}

TEST(PartitionByCostTest, Errors) {
  absl::StatusOr<std::vector<int64_t>> r = PartitionByCost({1, 2}, 3);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("3 is more than the model's 2"));
  EXPECT_THAT(PartitionByCost({1, 2}, 0).status().message(),
              HasSubstr("must be >= 1"));
  EXPECT_FALSE(PartitionByCost({}, 1).ok());
  EXPECT_THAT(PartitionByCost({1, -1}, 1).status().message(),
              HasSubstr("layer cost 1"));
  EXPECT_FALSE(PartitionByCost({1, std::nan("")}, 1).ok());
  EXPECT_FALSE(
      PartitionByCost({1, std::numeric_limits<double>::infinity()}, 1).ok());
}

TEST(StageBeginsTest, PrefixSums) {
  EXPECT_THAT(StageBegins({3, 1, 2}), ElementsAre(0, 3, 4));
  EXPECT_THAT(StageBegins({5}), ElementsAre(0));
  EXPECT_TRUE(StageBegins({}).empty());
}

// 784-256-128-10 MLP: linear, relu, linear, relu, linear.
gpipe::v1::JobSpec MlpSpec() {
  absl::StatusOr<gpipe::v1::JobSpec> spec = ParseJobSpecJson(R"({
    "model": {
      "input": {"dtype": "FLOAT32", "shape": {"dims": [784]}},
      "layers": [
        {"linear": {"in_features": 784, "out_features": 256}},
        {"relu": {}},
        {"linear": {"in_features": 256, "out_features": 128}},
        {"relu": {}},
        {"linear": {"in_features": 128, "out_features": 10}}
      ],
      "loss": {"softmax_cross_entropy": {}}
    },
    "optimizer": {"lr": 0.1, "sgd": {}},
    "data": {"fashion_mnist": {}},
    "batch_size": 16, "steps": 1, "seed": 5
  })");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

TEST(PartitionJobTest, ByCostModel) {
  const gpipe::v1::JobSpec spec = MlpSpec();
  // The first linear has ~85% of the FLOPs: it is a stage of its own.
  EXPECT_THAT(*PartitionJob(spec, 2), ElementsAre(1, 4));
  EXPECT_THAT(*PartitionJob(spec, 5), ElementsAre(1, 1, 1, 1, 1));
  EXPECT_THAT(PartitionJob(spec, 6).status().message(),
              HasSubstr("more than the model's 5 layers"));
}

TEST(PartitionJobTest, ExplicitBalanceWins) {
  gpipe::v1::JobSpec spec = MlpSpec();
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->add_balance(3);
  spec.mutable_pipeline()->add_balance(2);
  EXPECT_THAT(*PartitionJob(spec, 2), ElementsAre(3, 2));

  absl::StatusOr<std::vector<int64_t>> wrong_k = PartitionJob(spec, 3);
  EXPECT_THAT(wrong_k.status().message(), HasSubstr("pipeline.balance"));

  spec.mutable_pipeline()->set_balance(1, 3);  // sums to 6
  EXPECT_THAT(PartitionJob(spec, 2).status().message(),
              HasSubstr("pipeline.balance: sums to 6 but the model has 5"));
  spec.mutable_pipeline()->set_balance(1, 1);  // sums to 4
  EXPECT_THAT(PartitionJob(spec, 2).status().message(),
              HasSubstr("pipeline.balance: sums to 4"));
  spec.mutable_pipeline()->set_balance(0, 0);
  spec.mutable_pipeline()->set_balance(1, 5);
  EXPECT_THAT(PartitionJob(spec, 2).status().message(),
              HasSubstr("pipeline.balance[0]"));
}

// ZB-V's workers hold chunks g and 2K-1-g. Over 7 equal layers (the first
// without an input half) the chunks' min-max cut leaves one worker 4
// layers and the other 3 with the lighter first layer; the workers' cut
// gives the lighter one the 4th. Every cut the workers' cut is compared
// against is no better on its busiest worker.
TEST(PartitionByCostTest, ZeroBubbleVBalancesItsWorkers) {
  const std::vector<double> costs(7, 1.0);
  const std::vector<double> weights(4, 3.0);
  const std::vector<int64_t> chunks =
      *PartitionByCost(costs, 4, weights, /*first_layer_input_half=*/true);
  const std::vector<int64_t> workers =
      *PartitionByCost(costs, 4, weights, true, /*zero_bubble_v=*/true);
  const auto busiest = [&](const std::vector<int64_t>& b) {
    std::vector<double> c(4);
    int64_t begin = 0;
    for (int g = 0; g < 4; ++g) {
      c[g] = 3.0 * b[g] - (begin == 0 ? 1.0 : 0.0);
      begin += b[g];
    }
    return std::max(c[0] + c[3], c[1] + c[2]);
  };
  EXPECT_EQ(std::accumulate(workers.begin(), workers.end(), int64_t{0}), 7);
  EXPECT_DOUBLE_EQ(busiest(workers), 11.0);  // 4 layers, one without B
  EXPECT_DOUBLE_EQ(busiest(chunks), 12.0);
  // Every composition of 7 into 4: none has a less busy busiest worker.
  for (int64_t a = 1; a <= 4; ++a)
    for (int64_t b = 1; a + b <= 5; ++b)
      for (int64_t c = 1; a + b + c <= 6; ++c)
        EXPECT_GE(busiest({a, b, c, 7 - a - b - c}), 11.0);
}

// A job under ZB-V is cut for its workers where the cost model's step
// says so: the small Transformer at K=2, where the chunks' cut leaves one
// worker far busier than the other.
TEST(PartitionJobTest, ZeroBubbleVTakesTheFasterOfTheTwoCuts) {
  absl::StatusOr<gpipe::v1::JobSpec> spec = LoadJobSpecFile(
      std::string(GPIPE_SOURCE_DIR) + "/examples/char_transformer.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->mutable_pipeline()->set_stages(2);
  spec->mutable_pipeline()->set_micro_batches(8);
  spec->mutable_pipeline()->set_remat(gpipe::v1::NEVER);
  spec->mutable_pipeline()->clear_balance();
  const std::vector<int64_t> plain = *PartitionJob(*spec, 4);
  spec->mutable_pipeline()->set_schedule(gpipe::v1::ZERO_BUBBLE_V);
  spec->mutable_pipeline()->set_virtual_stages(2);
  const std::vector<int64_t> v = *PartitionJob(*spec, 4);
  EXPECT_NE(v, plain);
  const ModelShapes shapes = *InferModelShapes(spec->model());
  const auto step = [&](const std::vector<int64_t>& cut) {
    return CostModelStepSeconds(shapes, cut, 8, ScheduleKind::kZeroBubbleV, 2,
                                RematMode::kNever, spec->batch_size(),
                                UpdateTraffic(spec->optimizer()));
  };
  EXPECT_LT(step(v), 0.8 * step(plain));
}

// ZB-V's climb over the workers' cut compares scores within 1%, which is
// no strict order: on this model (a Linear, 161 ReLUs, a Linear: many
// nearly free layers) it went from cut to cut for good, in `gpipectl
// train` and in the controller's submit alike. It ends, with a valid cut.
TEST(PartitionJobTest, ZeroBubbleVOnManyCheapLayersEnds) {
  gpipe::v1::JobSpec spec = MlpSpec();
  gpipe::v1::ModelSpec* model = spec.mutable_model();
  model->mutable_input()->mutable_shape()->set_dims(0, 8);
  model->clear_layers();
  model->add_layers()->mutable_linear()->set_in_features(8);
  model->mutable_layers(0)->mutable_linear()->set_out_features(16);
  for (int i = 0; i < 161; ++i) model->add_layers()->mutable_relu();
  gpipe::v1::Linear* head = model->add_layers()->mutable_linear();
  head->set_in_features(16);
  head->set_out_features(3);
  spec.mutable_pipeline()->set_stages(2);
  spec.mutable_pipeline()->set_micro_batches(2);
  spec.mutable_pipeline()->set_schedule(gpipe::v1::ZERO_BUBBLE_V);
  absl::StatusOr<std::vector<int64_t>> cut = PartitionJob(spec, 4);
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_EQ(cut->size(), 4u);
  EXPECT_EQ(std::accumulate(cut->begin(), cut->end(), int64_t{0}), 163);
  for (int64_t b : *cut) EXPECT_GE(b, 1);
}

TEST(CostModelLayerCostsTest, FlopsWithAFloor) {
  const gpipe::v1::JobSpec spec = MlpSpec();
  absl::StatusOr<ModelShapes> shapes = InferModelShapes(spec.model());
  ASSERT_TRUE(shapes.ok());
  const std::vector<double> costs = CostModelLayerCosts(*shapes);
  ASSERT_EQ(costs.size(), 5u);
  for (size_t i = 0; i < costs.size(); ++i) {
    EXPECT_GT(costs[i], shapes->costs[i].forward_flops);
  }
  EXPECT_GT(costs[0], 100 * costs[1]);  // the floor stays small
}

TEST(MeasureLayerSecondsTest, OneFigurePerLayer) {
  const gpipe::v1::JobSpec spec = MlpSpec();
  absl::StatusOr<std::vector<double>> seconds = MeasureLayerSeconds(spec, 8, 3);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  ASSERT_EQ(seconds->size(), 5u);
  for (double s : *seconds) EXPECT_GE(s, 0);
  // Balancing by measured time gives a valid split.
  absl::StatusOr<std::vector<int64_t>> b = PartitionByCost(*seconds, 2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)[0] + (*b)[1], 5);
  EXPECT_FALSE(MeasureLayerSeconds(spec, 0, 3).ok());
  EXPECT_FALSE(MeasureLayerSeconds(spec, 8, 0).ok());
}

TEST(MeasureLayerSecondsTest, PassesApart) {
  const gpipe::v1::JobSpec spec = MlpSpec();
  absl::StatusOr<LayerPasses> passes = MeasureLayerPasses(spec, 8, 3);
  ASSERT_TRUE(passes.ok()) << passes.status();
  ASSERT_EQ(passes->forward.size(), 5u);
  ASSERT_EQ(passes->backward.size(), 5u);
  ASSERT_EQ(passes->weight.size(), 5u);
  // The weight half is timed where a split backward defers one (the
  // linears), and nothing elsewhere.
  absl::StatusOr<ModelShapes> shapes = InferModelShapes(spec.model());
  ASSERT_TRUE(shapes.ok());
  int deferring = 0;
  for (size_t l = 0; l < 5; ++l) {
    EXPECT_GT(passes->forward[l], 0) << l;
    EXPECT_GT(passes->backward[l], 0) << l;
    if (shapes->costs[l].deferred_bytes > 0) {
      ++deferring;
      EXPECT_GT(passes->weight[l], 0) << l;
    } else {
      EXPECT_LT(passes->weight[l], 1e-5) << l;  // an empty call
    }
  }
  EXPECT_GT(deferring, 0);
  EXPECT_FALSE(MeasureLayerPasses(spec, 0, 3).ok());
  EXPECT_FALSE(MeasureLayerPasses(spec, 8, 0).ok());
}

// The timed runs find the heap as a training step in steady state does: no
// pass is timed with the first touch of its memory. With one warm-up run,
// the CNN example's first ReLU found its gradient on fresh pages in three
// of five timed runs, and `plan --measure` put its 0.1 ms backward at 5 ms.
TEST(MeasureLayerSecondsTest, TimedRunsTouchNoNewMemory) {
  KeepFreedMemory();  // as gpipectl does
  absl::StatusOr<gpipe::v1::JobSpec> spec = LoadJobSpecFile(
      std::string(GPIPE_SOURCE_DIR) + "/examples/fashion_mnist_cnn.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<LayerPasses> passes = MeasureLayerPasses(*spec, 32, 5);
  ASSERT_TRUE(passes.ok()) << passes.status();
  EXPECT_EQ(passes->timed_page_faults, 0);
}

TEST(MeasureLayerSecondsTest, OnceAStepCostsOnlyWhereThereAreParameters) {
  gpipe::v1::JobSpec spec = MlpSpec();
  for (const char* optimizer : {"sgd", "adamw"}) {
    if (std::string(optimizer) == "adamw") {
      spec.mutable_optimizer()->mutable_adamw();
      spec.mutable_optimizer()->set_clip_norm(1.0f);
    }
    absl::StatusOr<LayerStepSeconds> once = MeasureLayerStepSeconds(spec, 8, 3);
    ASSERT_TRUE(once.ok()) << optimizer << ": " << once.status();
    ASSERT_EQ(once->norm.size(), 5u);
    ASSERT_EQ(once->update.size(), 5u);
    for (size_t l = 0; l < 5; ++l) {
      // The linears (0, 2, 4) have parameters; the ReLUs none.
      if (l % 2 == 0) {
        EXPECT_GT(once->norm[l], 0) << optimizer << " layer " << l;
        EXPECT_GT(once->update[l], 0) << optimizer << " layer " << l;
      } else {
        EXPECT_EQ(once->norm[l], 0) << optimizer << " layer " << l;
        EXPECT_EQ(once->update[l], 0) << optimizer << " layer " << l;
      }
    }
  }
  EXPECT_FALSE(MeasureLayerStepSeconds(spec, 0, 3).ok());
  EXPECT_FALSE(MeasureLayerStepSeconds(spec, 8, 0).ok());
}

TEST(MeasureLayerSecondsTest, TokenInputs) {
  absl::StatusOr<gpipe::v1::JobSpec> spec = LoadJobSpecFile(
      std::string(GPIPE_SOURCE_DIR) + "/examples/char_transformer.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::vector<double>> seconds =
      MeasureLayerSeconds(*spec, 2, 1);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_EQ(seconds->size(), 5u);
}

}  // namespace
}  // namespace gpipe
