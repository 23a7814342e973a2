// The backward in two halves (Layer::BackwardInput / BackwardWeight, what
// zero-bubble schedules run): the same input gradient and the same
// parameter gradients as the whole backward, bit for bit, whichever way the
// halves of several micro-batches interleave or group, as long as each half
// runs in micro-batch order.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/data/dataset.h"
#include "services/nn/layers/activations.h"
#include "services/nn/layers/attention.h"
#include "services/nn/layers/conv2d.h"
#include "services/nn/layers/embedding.h"
#include "services/nn/layers/layer_norm.h"
#include "services/nn/layers/linear.h"
#include "services/nn/layers/transformer_block.h"
#include "services/nn/model.h"
#include "services/pipeline/job_spec.h"

namespace gpipe {
namespace {

Tensor RandomTensor(const Shape& shape, uint64_t key) {
  Tensor t = Tensor::Empty(shape);
  Rng rng(key);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] = static_cast<float>(rng.Normal());
  return t;
}

LayerContext Training(int64_t micro_batch) {
  LayerContext ctx;
  ctx.seed = 5;
  ctx.step = 2;
  ctx.micro_batch = micro_batch;
  ctx.layer_index = 3;
  return ctx;
}

using MakeInput = std::function<Tensor(uint64_t key)>;

// Two micro-batches through `whole` (Backward) and `split` (the halves, in
// the order B0 B1 W0 W1, as ZB-H1's later stages run them): the same input
// gradients and accumulated parameter gradients, and the input half alone
// leaves the deferred parameters' gradients untouched.
void ExpectSplitMatchesWhole(Layer& whole, Layer& split, const MakeInput& input,
                             bool defers) {
  whole.Initialize(17);
  split.Initialize(17);
  std::vector<Saved> s1(2), s2(2), deferred(2);
  std::vector<Tensor> dys;
  for (int64_t m = 0; m < 2; ++m) {
    const Tensor x = input(100 + m);
    const Tensor y = whole.Forward(x, Training(m), &s1[m]);
    split.Forward(x, Training(m), &s2[m]);
    dys.push_back(RandomTensor(y.shape(), 200 + m));
  }
  std::vector<Tensor> dx_whole, dx_split;
  for (int64_t m = 0; m < 2; ++m)
    dx_whole.push_back(whole.Backward(dys[m], s1[m], Training(m)));
  for (int64_t m = 0; m < 2; ++m) {
    dx_split.push_back(
        split.BackwardInput(dys[m], s2[m], Training(m), &deferred[m]));
  }
  const std::vector<Parameter*> a = whole.Parameters(), b = split.Parameters();
  ASSERT_EQ(a.size(), b.size());
  if (defers) {
    bool untouched = true;
    for (Parameter* p : b)
      for (int64_t i = 0; i < p->grad.numel(); ++i)
        untouched = untouched && p->grad.f32()[i] == 0.0f;
    EXPECT_TRUE(untouched) << whole.kind() << ": the input half added weights";
  }
  for (int64_t m = 0; m < 2; ++m)
    split.BackwardWeight(s2[m], deferred[m], Training(m));
  for (int64_t m = 0; m < 2; ++m) {
    ASSERT_EQ(dx_whole[m].defined(), dx_split[m].defined());
    if (dx_whole[m].defined()) {
      EXPECT_TRUE(BitwiseEqual(dx_whole[m], dx_split[m]))
          << whole.kind() << " dx of micro-batch " << m;
    }
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(a[i]->grad, b[i]->grad))
        << whole.kind() << " " << a[i]->name;
  }
}

MakeInput Random(const Shape& shape) {
  return [shape](uint64_t key) { return RandomTensor(shape, key); };
}

TEST(SplitBackward, Linear) {
  Linear a(6, 5, true), b(6, 5, true);
  ExpectSplitMatchesWhole(a, b, Random({4, 6}), true);
  Linear c(6, 5, false), d(6, 5, false);
  ExpectSplitMatchesWhole(c, d, Random({2, 3, 6}), true);
}

TEST(SplitBackward, Conv2d) {
  Conv2d a({2, 5, 5}, 3, 3, 1, 1, true), b({2, 5, 5}, 3, 3, 1, 1, true);
  ExpectSplitMatchesWhole(a, b, Random({3, 2, 5, 5}), true);
  Conv2d c({3, 6, 6}, 2, 3, 2, 0, false), d({3, 6, 6}, 2, 3, 2, 0, false);
  ExpectSplitMatchesWhole(c, d, Random({2, 3, 6, 6}), true);
}

TEST(SplitBackward, Embedding) {
  Embedding a(11, 6, 5), b(11, 6, 5);
  ExpectSplitMatchesWhole(
      a, b,
      [](uint64_t key) {
        std::vector<int32_t> ids(10);
        Rng rng(key);
        for (int32_t& id : ids) id = static_cast<int32_t>(rng.Below(11));
        return Tensor::FromInts({2, 5}, ids);
      },
      true);
}

TEST(SplitBackward, SelfAttention) {
  SelfAttention a(8, 2, true), b(8, 2, true);
  ExpectSplitMatchesWhole(a, b, Random({2, 4, 8}), true);
}

TEST(SplitBackward, TransformerBlockWithDropout) {
  // The layer norms' gradients come with the input half; the first check
  // (nothing added by it) does not hold for them, so it is skipped here and
  // the GEMMs' deferral is checked by the next test.
  TransformerBlock a(8, 2, 16, 0.2f, true), b(8, 2, 16, 0.2f, true);
  ExpectSplitMatchesWhole(a, b, Random({2, 4, 8}), false);
  TransformerBlock c(8, 2, 16, 0.0f, true), d(8, 2, 16, 0.0f, true);
  ExpectSplitMatchesWhole(c, d, Random({2, 4, 8}), false);
}

TEST(SplitBackward, LayersWithoutDeferredWorkRunWholeInTheInputHalf) {
  LayerNorm a(6, 1e-5f, ""), b(6, 1e-5f, "");
  ExpectSplitMatchesWhole(a, b, Random({3, 6}), false);
  GELU c, d;
  ExpectSplitMatchesWhole(c, d, Random({3, 6}), false);
}

TEST(SplitBackward, TheInputHalfDropsWhatTheWeightHalfDoesNotRead) {
  TransformerBlock block(8, 2, 32, 0.0f, true);
  block.Initialize(3);
  Saved saved, deferred;
  const Tensor y =
      block.Forward(RandomTensor({2, 16, 8}, 1), Training(0), &saved);
  const int64_t before = saved.bytes();
  block.BackwardInput(RandomTensor(y.shape(), 2), saved, Training(0),
                      &deferred);
  // Kept: the four GEMMs' inputs; gone: the norms' statistics and inputs,
  // GELU's input, q/k/v and the attention probabilities.
  EXPECT_LT(saved.bytes(), before * 3 / 4);
  EXPECT_GT(deferred.bytes(), 0);
  ReLU relu;
  Saved relu_saved, nothing;
  relu.Forward(RandomTensor({4, 4}, 3), Training(0), &relu_saved);
  relu.BackwardInput(RandomTensor({4, 4}, 4), relu_saved, Training(0),
                     &nothing);
  EXPECT_EQ(relu_saved.bytes(), 0);
  EXPECT_EQ(nothing.bytes(), 0);
}

// An example's data and two models of it, built alike.
struct Example {
  std::unique_ptr<Dataset> dataset;
  std::unique_ptr<Model> a, b;
};
void LoadExample(const std::string& example, Example* out) {
  auto spec =
      LoadJobSpecFile(std::string(GPIPE_SOURCE_DIR) + "/examples/" + example);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto dataset = OpenJobDataset(*spec);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto a = Model::Build(spec->model(), spec->seed());
  auto b = Model::Build(spec->model(), spec->seed());
  ASSERT_TRUE(a.ok() && b.ok());
  out->dataset = std::move(*dataset);
  out->a = std::move(*a);
  out->b = std::move(*b);
}

// Whole models of every example: Model::BackwardInput then BackwardWeight
// against Model::Backward, two micro-batches each.
void ExpectModelSplitMatchesWhole(const std::string& example, int64_t batch) {
  Example e;
  ASSERT_NO_FATAL_FAILURE(LoadExample(example, &e));
  auto* dataset = &e.dataset;
  auto* whole = &e.a;
  auto* split = &e.b;
  std::vector<int64_t> first(batch), second(batch);
  for (int64_t i = 0; i < batch; ++i) {
    first[i] = i;
    second[i] = batch + i;
  }
  const Batch b0 = (*dataset)->Gather(Split::kTrain, first);
  const Batch b1 = (*dataset)->Gather(Split::kTrain, second);
  std::vector<std::vector<Saved>> s1(2), s2(2), deferred(2);
  std::vector<Tensor> dys;
  for (int64_t m = 0; m < 2; ++m) {
    const Tensor& x = m == 0 ? b0.inputs : b1.inputs;
    LayerContext ctx = Training(m);
    const Tensor y = (*whole)->Forward(x, ctx, &s1[m]);
    (*split)->Forward(x, ctx, &s2[m]);
    dys.push_back(RandomTensor(y.shape(), 300 + m));
  }
  for (int64_t m = 0; m < 2; ++m)
    (*whole)->Backward(dys[m], s1[m], Training(m));
  for (int64_t m = 0; m < 2; ++m)
    (*split)->BackwardInput(dys[m], &s2[m], Training(m), &deferred[m]);
  for (int64_t m = 0; m < 2; ++m)
    (*split)->BackwardWeight(s2[m], deferred[m], Training(m));
  const auto& a = (*whole)->Parameters();
  const auto& b = (*split)->Parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(a[i].param->grad, b[i].param->grad))
        << example << " " << a[i].name;
  }
}

TEST(SplitBackward, EveryExampleModel) {
  ExpectModelSplitMatchesWhole("fashion_mnist_mlp.json", 8);
  ExpectModelSplitMatchesWhole("fashion_mnist_cnn.json", 4);
  ExpectModelSplitMatchesWhole("char_transformer.json", 2);
}

// Weight halves grouped over micro-batches (Model::BackwardGrouping, then
// Model::BackwardWeights): the input gradients and the parameter gradients
// of the micro-batches' whole backwards in turn, bit for bit, for groups of
// any size and micro-batches of unequal rows.
// Micro-batches of `rows` samples of `example`'s data through one model
// whole, micro-batch after micro-batch, and through another with the
// weight halves in groups of the sizes `groups` gives (summing to the
// micro-batch count).
void ExpectGroupsMatchWhole(const std::string& example,
                            const std::vector<int64_t>& rows,
                            const std::vector<int64_t>& groups) {
  SCOPED_TRACE(example);
  Example e;
  ASSERT_NO_FATAL_FAILURE(LoadExample(example, &e));
  auto* dataset = &e.dataset;
  auto* whole = &e.a;
  auto* grouped = &e.b;
  ASSERT_TRUE((*grouped)->GroupsWeightHalves());
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<std::vector<Saved>> s1(n), s2(n), deferred(n);
  std::vector<Tensor> dys;
  int64_t first = 0;
  for (int64_t m = 0; m < n; ++m) {
    std::vector<int64_t> indices(rows[m]);
    for (int64_t i = 0; i < rows[m]; ++i) indices[i] = first + i;
    first += rows[m];
    const Batch b = (*dataset)->Gather(Split::kTrain, indices);
    const Tensor y = (*whole)->Forward(b.inputs, Training(m), &s1[m]);
    (*grouped)->Forward(b.inputs, Training(m), &s2[m]);
    dys.push_back(RandomTensor(y.shape(), 300 + m));
  }
  // As at a step's start: the first product onto each gradient writes it
  // (Parameter::grad_unwritten).
  (*whole)->ZeroGrad();
  (*grouped)->ZeroGrad();
  std::vector<Tensor> dx_whole, dx_grouped;
  for (int64_t m = 0; m < n; ++m)
    dx_whole.push_back((*whole)->Backward(dys[m], s1[m], Training(m)));
  int64_t m = 0;
  for (const int64_t size : groups) {
    std::vector<Model::DeferredWeights> group;
    for (int64_t j = 0; j < size; ++j, ++m) {
      dx_grouped.push_back((*grouped)->BackwardGrouping(
          dys[m], &s2[m], Training(m), &deferred[m]));
      group.push_back({&s2[m], &deferred[m], Training(m)});
    }
    std::vector<int64_t> layers_done;
    (*grouped)->BackwardWeights(
        group, /*every_layer=*/false,
        [&](int64_t layer) { layers_done.push_back(layer); });
    std::vector<int64_t> last_to_first;
    for (int64_t i = (*grouped)->size(); i-- > 0;) last_to_first.push_back(i);
    EXPECT_EQ(layers_done, last_to_first);
  }
  ASSERT_EQ(m, n);
  for (m = 0; m < n; ++m) {
    ASSERT_EQ(dx_whole[m].defined(), dx_grouped[m].defined());
    if (dx_whole[m].defined()) {
      EXPECT_TRUE(BitwiseEqual(dx_whole[m], dx_grouped[m]))
          << "input gradient of micro-batch " << m;
    }
  }
  const auto& a = (*whole)->Parameters();
  const auto& b = (*grouped)->Parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(a[i].param->grad, b[i].param->grad)) << a[i].name;
  }
}

TEST(WeightGroups, AreTheWholeBackwardsInTurnBitForBit) {
  // Unequal micro-batches, a group of one, groups across the first
  // product onto an unwritten gradient.
  ExpectGroupsMatchWhole("fashion_mnist_mlp.json", {5, 4, 4, 3, 7, 1},
                         {3, 1, 2});
  // Products deep enough for the GEMM's threads and for its depth in
  // passes (k > 512 rows).
  ExpectGroupsMatchWhole("fashion_mnist_mlp.json", {200, 150, 250, 40}, {3, 1});
  // Convolutions run whole; only the head's linear layers group.
  ExpectGroupsMatchWhole("fashion_mnist_cnn.json", {3, 2, 3}, {2, 1});
  ExpectGroupsMatchWhole("char_transformer.json", {2, 1, 2}, {3});
}

TEST(WeightGroups, ALinearGroupIsItsWeightHalvesInTurn) {
  Linear a(6, 5, /*bias=*/true), b(6, 5, /*bias=*/true);
  a.Initialize(3);
  b.Initialize(3);
  std::vector<Saved> sa(3), sb(3), da(3), db(3);
  std::vector<WeightHalf> halves;
  for (int64_t m = 0; m < 3; ++m) {
    const Tensor x = RandomTensor(Shape({2 + m, 6}), 10 + m);
    const Tensor dy = RandomTensor(Shape({2 + m, 5}), 20 + m);
    a.Forward(x, Training(m), &sa[m]);
    b.Forward(x, Training(m), &sb[m]);
    a.BackwardInput(dy, sa[m], Training(m), &da[m]);
    b.BackwardInput(dy, sb[m], Training(m), &db[m]);
    halves.push_back({&sb[m], &db[m], Training(m)});
  }
  for (int64_t m = 0; m < 3; ++m) a.BackwardWeight(sa[m], da[m], Training(m));
  const WeightGroupCost cost = b.GroupCost(sb[2]);
  EXPECT_EQ(cost.rows, 4);
  EXPECT_EQ(cost.held_bytes, 4 * (6 + 5) * 4);  // x and dy
  EXPECT_EQ(cost.gradient_bytes, (6 * 5 + 5) * 4);
  b.BackwardWeights(halves);
  for (size_t i = 0; i < a.Parameters().size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(a.Parameters()[i]->grad, b.Parameters()[i]->grad))
        << a.Parameters()[i]->name;
  }
}

TEST(WeightGroups, EnoughRowsForTheSmallestProductWithinTheHeldShare) {
  const auto size = [](std::vector<WeightGroupCost> costs) {
    return WeightGroupSize(costs);
  };
  // A 1024-wide layer on 32 rows: 8 micro-batches make 256 rows, and hold
  // 8 x 256 KiB of operands, half its 4 MiB gradient.
  const WeightGroupCost wide{32, 32 * 2048 * 4, 1024 * 1024 * 4};
  EXPECT_EQ(size({wide}), 8);
  // The smallest product's rows decide (16 rows: 16 micro-batches), within
  // half the two gradients (10 hold 3.75 MiB); past 256 rows, none.
  EXPECT_EQ(size({wide, {16, 16 * 2048 * 4, 1024 * 1024 * 4}}), 10);
  EXPECT_EQ(size({{64, 64 * 2048 * 4, 1024 * 1024 * 4}}), 4);
  EXPECT_EQ(size({{256, 256 * 2048 * 4, 1024 * 1024 * 4}}), 1);
  // Operands that outweigh half the gradient.
  EXPECT_EQ(size({{32, 1 << 20, 4 << 20}}), 2);
  EXPECT_EQ(size({{32, 3 << 20, 4 << 20}}), 1);
  // Gradients that stay in the caches.
  EXPECT_EQ(size({{32, 32 * 2048 * 4, (4 << 20) - 4}}), 1);
  EXPECT_EQ(size({}), 1);
}

TEST(WeightGroups, AModelAsksItsGroupingLayers) {
  auto spec = ParseJobSpecJson(R"({
    "model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [1024]}},
              "layers": [{"linear": {"inFeatures": 1024, "outFeatures": 1024}},
                         {"relu": {}},
                         {"linear": {"inFeatures": 1024, "outFeatures": 16}}],
              "loss": {"softmaxCrossEntropy": {}}},
    "optimizer": {"lr": 0.01, "sgd": {}},
    "data": {"synthetic": {"task": "CLASSES", "features": 1024, "classes": 16,
                           "trainSamples": 64, "testSamples": 8}},
    "batchSize": 64, "steps": 1, "seed": 1})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = Model::Build(spec->model(), spec->seed());
  ASSERT_TRUE(model.ok());
  for (const int64_t rows : {8, 32, 64}) {
    std::vector<Saved> saved;
    (*model)->Forward(RandomTensor(Shape({rows, 1024}), 7), Training(0),
                      &saved);
    std::vector<WeightGroupCost> costs;
    for (const auto& [in, out] : {std::pair{1024, 1024}, std::pair{1024, 16}})
      costs.push_back({rows, rows * (in + out) * 4, (in * out + out) * 4});
    EXPECT_EQ((*model)->WeightGroupSize(saved), WeightGroupSize(costs))
        << rows << " rows";
    EXPECT_GT((*model)->WeightGroupSize(saved), 1) << rows << " rows";
  }
  EXPECT_EQ((*model)->WeightGroupSize({}), 1);
}

}  // namespace
}  // namespace gpipe
