// Weight halves grouped over micro-batches (Model::BackwardGrouping, then
// Model::BackwardWeights): the input gradients and the parameter gradients
// of the micro-batches' whole backwards in turn, bit for bit, for groups of
// any size and micro-batches of unequal rows.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/nn/layers/linear.h"
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
  return ctx;
}

// Micro-batches of `rows` samples of `example`'s data through one model
// whole, micro-batch after micro-batch, and through another with the
// weight halves in groups of the sizes `groups` gives (summing to the
// micro-batch count).
void ExpectGroupsMatchWhole(const std::string& example,
                            const std::vector<int64_t>& rows,
                            const std::vector<int64_t>& groups) {
  SCOPED_TRACE(example);
  auto spec =
      LoadJobSpecFile(std::string(GPIPE_SOURCE_DIR) + "/examples/" + example);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto dataset = OpenJobDataset(*spec);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto whole = Model::Build(spec->model(), spec->seed());
  auto grouped = Model::Build(spec->model(), spec->seed());
  ASSERT_TRUE(whole.ok() && grouped.ok());
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
        group, [&](int64_t layer) { layers_done.push_back(layer); });
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
  EXPECT_EQ(b.WeightRows(sb[2]), 4);
  b.BackwardWeights(halves);
  for (size_t i = 0; i < a.Parameters().size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(a.Parameters()[i]->grad, b.Parameters()[i]->grad))
        << a.Parameters()[i]->name;
  }
}

TEST(WeightGroups, GroupEnoughRowsForTheSmallestProduct) {
  auto spec = LoadJobSpecFile(std::string(GPIPE_SOURCE_DIR) +
                              "/examples/fashion_mnist_mlp.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto model = Model::Build(spec->model(), spec->seed());
  ASSERT_TRUE(model.ok());
  auto dataset = OpenJobDataset(*spec);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  for (const int64_t rows : {32, 100, 256, 300}) {
    std::vector<int64_t> indices(rows);
    for (int64_t i = 0; i < rows; ++i) indices[i] = i;
    std::vector<Saved> saved;
    (*model)->Forward((*dataset)->Gather(Split::kTrain, indices).inputs,
                      Training(0), &saved);
    EXPECT_EQ((*model)->WeightGroupSize(saved),
              (Model::kWeightGroupRows + rows - 1) / rows)
        << rows << " rows";
  }
  EXPECT_EQ((*model)->WeightGroupSize({}), 1);
}

}  // namespace
}  // namespace gpipe
