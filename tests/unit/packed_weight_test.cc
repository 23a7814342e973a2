// A weight packed ahead for the GEMM is packed again whenever it may have
// changed, so a product never runs on a stale copy: the bits are always
// those of Gemm on the weight as it is now.
#include "services/tensor/packed_weight.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/nn/layer_spec.h"
#include "services/nn/layers/linear.h"
#include "services/nn/model.h"
#include "services/nn/optimizer.h"
#include "services/tensor/cpu/gemm.h"

namespace gpipe {
namespace {

Tensor Random(const Shape& shape, uint64_t key) {
  std::vector<float> v(shape.numel());
  Rng rng(key);
  for (float& x : v) x = static_cast<float>(rng.Normal());
  return Tensor::FromVector(shape, v);
}

// y = x W^T by Gemm on the weight's current bytes.
std::vector<float> Direct(const Tensor& x, const Tensor& w) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  std::vector<float> y(m * n);
  cpu::Gemm(false, true, m, n, k, 1.0f, x.f32(), w.f32(), 0.0f, y.data());
  return y;
}

std::vector<float> Packed(PackedWeight& pack, const Tensor& x,
                          const Tensor& w) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  std::vector<float> y(m * n);
  pack.Multiply(true, m, n, k, x.f32(), w, y.data());
  return y;
}

TEST(PackedWeight, PacksOnceWhileTheWeightIsUnchanged) {
  const Tensor w = Random({64, 48}, 1);
  PackedWeight pack;
  for (int i = 0; i < 4; ++i) {
    const Tensor x = Random({5 + i, 48}, 10 + i);
    ASSERT_EQ(Packed(pack, x, w), Direct(x, w));
  }
  EXPECT_EQ(pack.packs(), 1);
  EXPECT_GT(pack.bytes(), 0);
}

// Each version of the weight serves two products, so a copy pays and is
// kept (see UsedOnceItIsMultipliedAsItIs).
TEST(PackedWeight, PacksAgainAfterEveryKindOfWrite) {
  Tensor w = Random({64, 48}, 2);
  const Tensor x = Random({7, 48}, 3);
  PackedWeight pack;
  const auto twice = [&](const Tensor& weight) {
    const std::vector<float> first = Packed(pack, x, weight);
    EXPECT_EQ(Packed(pack, x, weight), first);
    return first;
  };
  ASSERT_EQ(twice(w), Direct(x, w));

  // An element written through a pointer (an optimizer's update).
  w.f32()[5] += 1.0f;
  EXPECT_EQ(twice(w), Direct(x, w));
  EXPECT_EQ(pack.packs(), 2);

  // Copied over (a restored checkpoint).
  w.CopyFrom(Random({64, 48}, 4));
  EXPECT_EQ(twice(w), Direct(x, w));
  EXPECT_EQ(pack.packs(), 3);

  // Written through a view that shares the storage.
  w.Rows(10, 11).SetZero();
  EXPECT_EQ(twice(w), Direct(x, w));
  EXPECT_EQ(pack.packs(), 4);

  // Another tensor with the same bytes: another storage, packed again.
  const Tensor same_bytes = w.Clone();
  EXPECT_EQ(twice(same_bytes), Direct(x, same_bytes));
  EXPECT_EQ(pack.packs(), 5);

  // Reading through a const tensor is no write.
  const Tensor& reader = same_bytes;
  EXPECT_NE(reader.f32(), nullptr);
  EXPECT_EQ(twice(same_bytes), Direct(x, same_bytes));
  EXPECT_EQ(pack.packs(), 5);

  pack.Clear();
  EXPECT_EQ(pack.bytes(), 0);
  EXPECT_EQ(twice(same_bytes), Direct(x, same_bytes));
  EXPECT_EQ(pack.packs(), 6);
}

// A step of one micro-batch uses each copy once: after a version that
// served one product the weight is multiplied as it is (no copy held, the
// same bits), and packed again once a version serves two.
TEST(PackedWeight, UsedOnceItIsMultipliedAsItIs) {
  Tensor w = Random({64, 48}, 31);
  const Tensor x = Random({7, 48}, 32);
  PackedWeight pack;
  ASSERT_EQ(Packed(pack, x, w), Direct(x, w));  // the first version packs
  EXPECT_EQ(pack.packs(), 1);
  for (int step = 0; step < 3; ++step) {
    w.f32()[step] += 1.0f;
    pack.Prepare(true, 64, 48, w);  // as a stage's update does
    EXPECT_EQ(Packed(pack, x, w), Direct(x, w)) << step;
    EXPECT_EQ(pack.packs(), 1) << step;
    EXPECT_EQ(pack.bytes(), 0) << step;
  }
  // Two products on one version: the next version is packed again.
  EXPECT_EQ(Packed(pack, x, w), Direct(x, w));
  w.f32()[7] -= 1.0f;
  pack.Prepare(true, 64, 48, w);
  EXPECT_EQ(pack.packs(), 2);
  EXPECT_GT(pack.bytes(), 0);
  EXPECT_EQ(Packed(pack, x, w), Direct(x, w));
  EXPECT_EQ(pack.packs(), 2);
}

TEST(PackedWeight, ALinearLayerSeesItsWeightUpdated) {
  // The layer's forward and input gradient after its weight changes in
  // place, as an optimizer step changes it, against a fresh layer given the
  // new weight (which packs it for the first time).
  Linear layer(48, 64, /*bias=*/true);
  layer.Initialize(7);
  const Tensor x = Random({9, 48}, 8), dy = Random({9, 64}, 9);
  LayerContext ctx;
  ctx.input_grad = true;
  for (int step = 0; step < 3; ++step) {
    Saved saved;
    const Tensor y = layer.Forward(x, ctx, &saved);
    const Tensor dx = layer.Backward(dy, saved, ctx);
    Linear fresh(48, 64, /*bias=*/true);
    for (size_t p = 0; p < layer.Parameters().size(); ++p)
      fresh.Parameters()[p]->value.CopyFrom(layer.Parameters()[p]->value);
    Saved fresh_saved;
    ASSERT_TRUE(BitwiseEqual(fresh.Forward(x, ctx, &fresh_saved), y))
        << "step " << step;
    ASSERT_TRUE(BitwiseEqual(fresh.Backward(dy, fresh_saved, ctx), dx))
        << "step " << step;
    // An SGD-like update through the parameter's pointer.
    Parameter* w = layer.Parameters()[0];
    for (int64_t i = 0; i < w->value.numel(); ++i)
      w->value.f32()[i] -= 0.01f * w->grad.f32()[i];
  }
}

TEST(PackedWeight, PreparedAheadTheProductsDoNotPackAgain) {
  Tensor w = Random({64, 48}, 12);
  const Tensor x = Random({6, 48}, 13);
  PackedWeight pack;
  pack.Prepare(true, 64, 48, w);
  EXPECT_EQ(pack.packs(), 1);
  pack.Prepare(true, 64, 48, w);  // current: nothing to do
  EXPECT_EQ(Packed(pack, x, w), Direct(x, w));
  EXPECT_EQ(pack.packs(), 1);
  EXPECT_EQ(Packed(pack, x, w), Direct(x, w));  // a second product
  // A write after preparing still packs again before the product.
  w.f32()[3] -= 0.5f;
  EXPECT_EQ(Packed(pack, x, w), Direct(x, w));
  EXPECT_EQ(pack.packs(), 2);
}

// A copy is packed for products of the rows the last one had (deeper
// passes for a micro-batch's few rows where the tile has them), and serves
// products of other rows with the same bits.
TEST(PackedWeight, PacksForTheRowsOfTheLastProduct) {
  const int64_t in = 1500, out = 40;
  Tensor w = Random({out, in}, 14);
  const Tensor few = Random({32, in}, 15), many = Random({200, in}, 16);
  cpu::PackedB for_few, for_many;
  for_few.Pack(true, in, out, w.f32(), in, 32);
  for_many.Pack(true, in, out, w.f32(), in, 200);
  PackedWeight pack;
  ASSERT_EQ(Packed(pack, few, w), Direct(few, w));
  ASSERT_EQ(Packed(pack, few, w), Direct(few, w));
  EXPECT_EQ(pack.depth_block(), for_few.depth_block());
  w.f32()[5] += 0.25f;  // the update; then the step packs ahead
  pack.Prepare(true, out, in, w);
  EXPECT_EQ(pack.depth_block(), for_few.depth_block());
  EXPECT_EQ(Packed(pack, many, w), Direct(many, w));  // packed for 32 rows
  EXPECT_EQ(Packed(pack, many, w), Direct(many, w));
  w.f32()[6] -= 0.25f;
  pack.Prepare(true, out, in, w);
  EXPECT_EQ(pack.depth_block(), for_many.depth_block());
  EXPECT_EQ(Packed(pack, few, w), Direct(few, w));
  EXPECT_EQ(pack.packs(), 3);
  if (cpu::BestGemmTile().kc_few_rows > 0) {
    EXPECT_GT(for_few.depth_block(), for_many.depth_block());
  }
}

TEST(PackedWeight, ALinearPacksAheadTheSameBitsAndOnlyWhatItUses) {
  Linear ahead(48, 64, /*bias=*/true), lazy(48, 64, /*bias=*/true);
  ahead.Initialize(21);
  lazy.Initialize(21);
  // Without the input gradient (a model's first layer) only the forward's
  // copy is made.
  ahead.PackWeights(/*input_grad=*/false);
  const int64_t forward_only = ahead.packed_bytes();
  EXPECT_GT(forward_only, 0);
  ahead.PackWeights(/*input_grad=*/true);
  EXPECT_GT(ahead.packed_bytes(), forward_only);
  EXPECT_EQ(lazy.packed_bytes(), 0);
  const Tensor x = Random({9, 48}, 22), dy = Random({9, 64}, 23);
  LayerContext ctx;
  ctx.input_grad = true;
  Saved a, b;
  ASSERT_TRUE(
      BitwiseEqual(ahead.Forward(x, ctx, &a), lazy.Forward(x, ctx, &b)));
  EXPECT_TRUE(
      BitwiseEqual(ahead.Backward(dy, a, ctx), lazy.Backward(dy, b, ctx)));
}

// A model's weights packed by the optimizer's step, each right after its
// update (Model::PackAfterUpdate): every Linear holds its copies of the new
// weight before the next forward, the model's first without the input
// gradient's, and the next step's products are those of a model given the
// updated weights.
TEST(PackedWeight, AModelPacksEachWeightAfterItsUpdate) {
  v1::ModelSpec spec;
  spec.mutable_input()->set_dtype(v1::FLOAT32);
  spec.mutable_input()->mutable_shape()->add_dims(12);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{12, 16}, {16, 8}}) {
    auto& l = *spec.add_layers()->mutable_linear();
    l.set_in_features(in);
    l.set_out_features(out);
    spec.add_layers()->mutable_relu();
  }
  spec.mutable_loss()->mutable_softmax_cross_entropy();
  auto model = Model::Build(spec, /*seed=*/4);
  ASSERT_TRUE(model.ok()) << model.status();
  auto fresh = Model::Build(spec, /*seed=*/4);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  v1::OptimizerSpec opt;
  opt.mutable_adamw();
  auto optimizer = MakeOptimizer(opt, (*model)->Parameters());
  ASSERT_TRUE(optimizer.ok());
  const Tensor x = Random({5, 12}, 31);
  LayerContext ctx;
  // Two micro-batches: a copy pays for itself from a weight's second
  // product on (PackedWeight), so each Linear keeps its copies.
  for (int m = 0; m < 2; ++m) {
    std::vector<Saved> saved;
    const Tensor y = (*model)->Forward(x, ctx, &saved);
    (*model)->Backward(Random(y.shape(), 32 + m), saved, ctx);
  }
  auto& first = static_cast<Linear&>((*model)->layer(0));
  auto& second = static_cast<Linear&>((*model)->layer(2));
  const int64_t first_packs = first.packs(), second_packs = second.packs();
  (*optimizer)->Step(0.1f, 1, [&](size_t i) { (*model)->PackAfterUpdate(i); });
  // Packed in the step: the forward's copy of the first, both copies of
  // the second.
  EXPECT_EQ(first.packs(), first_packs + 1);
  EXPECT_EQ(second.packs(), second_packs + 2);
  // The model's first layer makes no input gradient: its forward's copy
  // only.
  Linear forward_only(12, 16, /*bias=*/true);
  forward_only.PackWeights(/*input_grad=*/false);
  EXPECT_EQ(first.packed_bytes(), forward_only.packed_bytes());
  Linear both(16, 8, /*bias=*/true);
  both.PackWeights(/*input_grad=*/true);
  EXPECT_EQ(second.packed_bytes(), both.packed_bytes());
  for (size_t p = 0; p < (*model)->Parameters().size(); ++p) {
    (*fresh)->Parameters()[p].param->value.CopyFrom(
        (*model)->Parameters()[p].param->value);
  }
  std::vector<Saved> a, b;
  const Tensor y = (*model)->Forward(x, ctx, &a);
  EXPECT_TRUE(BitwiseEqual(y, (*fresh)->Forward(x, ctx, &b)));
  // The backward's products: the second Linear's input gradient feeds
  // the first's weight gradient.
  (*model)->ZeroGrad();
  (*fresh)->ZeroGrad();
  const Tensor dy = Random(y.shape(), 40);
  (*model)->Backward(dy, a, ctx);
  (*fresh)->Backward(dy, b, ctx);
  EXPECT_TRUE(BitwiseEqual((*model)->Parameters()[0].param->grad,
                           (*fresh)->Parameters()[0].param->grad));
  // The step's products found the copies current.
  EXPECT_EQ(first.packs(), first_packs + 1);
  EXPECT_EQ(second.packs(), second_packs + 2);
}

TEST(PackedWeight, TheMemoryModelCountsWhatALinearHolds) {
  for (auto [in, out] :
       {std::pair<int64_t, int64_t>{48, 64}, {1024, 10}, {784, 1024}}) {
    Linear layer(in, out, /*bias=*/true);
    layer.Initialize(3);
    LayerContext ctx;
    ctx.input_grad = true;
    Saved saved;
    const Tensor x = Random({4, in}, 5);
    const Tensor y = layer.Forward(x, ctx, &saved);
    layer.Backward(Random({4, out}, 6), saved, ctx);
    v1::LayerSpec spec;
    spec.mutable_linear()->set_in_features(in);
    spec.mutable_linear()->set_out_features(out);
    const LayerCost cost = EstimateCost(spec, Shape({in}), Shape({out}));
    // Both copies, each at least the weight and at most the bound.
    EXPECT_GE(layer.packed_bytes(), 2 * in * out * 4) << in << "->" << out;
    EXPECT_LE(layer.packed_bytes(), cost.packed_weight_bytes)
        << in << "->" << out;
  }
}

}  // namespace
}  // namespace gpipe
