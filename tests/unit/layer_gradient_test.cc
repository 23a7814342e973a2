// Every layer's backward against central finite differences of
// f = sum(Forward(x) * r) for a fixed random r, on small shapes.
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "services/core/rng.h"
#include "services/nn/layers/activations.h"
#include "services/nn/layers/attention.h"
#include "services/nn/layers/batch_norm.h"
#include "services/nn/layers/conv2d.h"
#include "services/nn/layers/dropout.h"
#include "services/nn/layers/embedding.h"
#include "services/nn/layers/flatten.h"
#include "services/nn/layers/layer_norm.h"
#include "services/nn/layers/linear.h"
#include "services/nn/layers/pooling.h"
#include "services/nn/layers/transformer_block.h"
#include "services/nn/loss.h"
#include "services/nn/running_statistics.h"

namespace gpipe {
namespace {

Tensor RandomTensor(const Shape& shape, uint64_t key, float scale = 1.0f) {
  Tensor t = Tensor::Empty(shape);
  Rng rng(key);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] = static_cast<float>(rng.Normal() * scale);
  return t;
}

// Values spread at least 0.05 apart in random order: no ReLU kink or max-pool
// tie lies within the finite-difference step.
Tensor SpreadTensor(const Shape& shape, uint64_t key) {
  Tensor t = Tensor::Empty(shape);
  const int64_t n = t.numel();
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  Rng rng(key);
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[i], order[rng.Below(i + 1)]);
  for (int64_t i = 0; i < n; ++i)
    t.f32()[order[i]] = -1.0f + 0.05f * i + 0.025f;
  return t;
}

double Objective(Layer& layer, const Tensor& x, const Tensor& r,
                 const LayerContext& ctx) {
  LayerContext c = ctx;
  c.recompute = true;  // no side effects while probing
  Tensor y = layer.Forward(x, c, nullptr);
  double s = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i)
    s += static_cast<double>(y.f32()[i]) * r.f32()[i];
  return s;
}

void ExpectClose(double analytic, double numeric, const std::string& what) {
  const double tol =
      2e-3 + 2e-2 * std::max(std::fabs(analytic), std::fabs(numeric));
  EXPECT_NEAR(analytic, numeric, tol) << what;
}

// Checks dx (when the input is float) and every parameter gradient at up to
// `probes` coordinates each.
void CheckGradients(Layer& layer, Tensor x, const LayerContext& ctx,
                    int probes = 24, float eps = 1e-2f) {
  layer.Initialize(MixKey({99, 1}));
  // Nudge parameters off their special initial values (ones, zeros).
  for (Parameter* p : layer.Parameters()) {
    Tensor noise = RandomTensor(
        p->value.shape(), MixKey({7, static_cast<uint64_t>(p->value.numel())}),
        0.1f);
    for (int64_t i = 0; i < p->value.numel(); ++i)
      p->value.f32()[i] += noise.f32()[i];
    p->grad.SetZero();
  }
  Saved saved;
  Tensor y = layer.Forward(x, ctx, &saved);
  Tensor r = RandomTensor(y.shape(), 1234);
  Tensor dx = layer.Backward(r, saved, ctx);
  Rng pick(42);
  if (x.dtype() == DType::kF32) {
    ASSERT_TRUE(dx.defined());
    ASSERT_EQ(dx.shape(), x.shape());
    for (int k = 0; k < probes; ++k) {
      const int64_t i = pick.Below(x.numel());
      const float keep = x.f32()[i];
      x.f32()[i] = keep + eps;
      const double plus = Objective(layer, x, r, ctx);
      x.f32()[i] = keep - eps;
      const double minus = Objective(layer, x, r, ctx);
      x.f32()[i] = keep;
      ExpectClose(dx.f32()[i], (plus - minus) / (2 * eps),
                  std::string(layer.kind()) + " dx[" + std::to_string(i) + "]");
    }
  }
  for (Parameter* p : layer.Parameters()) {
    for (int k = 0; k < probes; ++k) {
      const int64_t i = pick.Below(p->value.numel());
      const float keep = p->value.f32()[i];
      p->value.f32()[i] = keep + eps;
      const double plus = Objective(layer, x, r, ctx);
      p->value.f32()[i] = keep - eps;
      const double minus = Objective(layer, x, r, ctx);
      p->value.f32()[i] = keep;
      ExpectClose(p->grad.f32()[i], (plus - minus) / (2 * eps),
                  std::string(layer.kind()) + " " + p->name + "[" +
                      std::to_string(i) + "]");
    }
  }
}

LayerContext Training() {
  LayerContext ctx;
  ctx.training = true;
  ctx.seed = 5;
  ctx.step = 3;
  ctx.micro_batch = 1;
  ctx.layer_index = 2;
  return ctx;
}

TEST(LayerGradient, Linear) {
  Linear layer(5, 4, true);
  CheckGradients(layer, RandomTensor({3, 2, 5}, 1), Training());
}

TEST(LayerGradient, LinearWithoutBias) {
  Linear layer(6, 3, false);
  CheckGradients(layer, RandomTensor({4, 6}, 2), Training());
}

// Model::ZeroGrad only marks a Linear's weight gradient unwritten
// (Parameter::grad_unwritten), and the step's first product overwrites it:
// whatever the tensor held, the gradient after two micro-batches must be
// the one accumulated onto zeros, bit for bit, in either backward.
TEST(LayerGradient, ALinearsFirstWeightGradientOverwritesAnUnwrittenOne) {
  for (const bool split : {false, true}) {
    SCOPED_TRACE(split ? "split backward" : "whole backward");
    Linear zeroed(6, 5, true), unwritten(6, 5, true);
    zeroed.Initialize(MixKey({3, 1}));
    unwritten.Initialize(MixKey({3, 1}));
    Parameter& weight = *unwritten.Parameters()[0];
    ASSERT_TRUE(weight.first_gradient_overwrites);
    for (int64_t i = 0; i < weight.grad.numel(); ++i)
      weight.grad.f32()[i] = std::nanf("");
    weight.grad_unwritten = true;
    for (const int64_t mb : {0, 1}) {
      const Tensor x = RandomTensor({7, 6}, 10 + mb);
      const Tensor dy = RandomTensor({7, 5}, 20 + mb);
      for (Linear* layer : {&zeroed, &unwritten}) {
        Saved saved;
        layer->Forward(x, Training(), &saved);
        if (split) {
          Saved deferred;
          layer->BackwardInput(dy, saved, Training(), &deferred);
          layer->BackwardWeight(saved, deferred, Training());
        } else {
          layer->Backward(dy, saved, Training());
        }
      }
      EXPECT_FALSE(weight.grad_unwritten);
    }
    const Tensor& want = zeroed.Parameters()[0]->grad;
    EXPECT_EQ(std::memcmp(weight.grad.f32(), want.f32(), want.nbytes()), 0);
  }
}

TEST(LayerGradient, ReLU) {
  ReLU layer;
  CheckGradients(layer, SpreadTensor({4, 10}, 3), Training());
}

TEST(LayerGradient, GELU) {
  GELU layer;
  CheckGradients(layer, RandomTensor({4, 10}, 4), Training());
}

TEST(LayerGradient, Tanh) {
  Tanh layer;
  CheckGradients(layer, RandomTensor({4, 10}, 5), Training());
}

TEST(LayerGradient, Dropout) {
  Dropout layer(0.3f);
  CheckGradients(layer, RandomTensor({4, 16}, 6), Training());
}

TEST(LayerGradient, LayerNorm) {
  LayerNorm layer(8, 1e-5f);
  CheckGradients(layer, RandomTensor({3, 2, 8}, 7), Training());
}

TEST(LayerGradient, Embedding) {
  Embedding layer(11, 6, 5);
  Tensor ids = Tensor::FromInts({2, 5}, {1, 4, 4, 10, 0, 3, 3, 7, 2, 9});
  CheckGradients(layer, ids, Training());
}

TEST(LayerGradient, CausalSelfAttention) {
  SelfAttention layer(8, 2, true);
  CheckGradients(layer, RandomTensor({2, 5, 8}, 8, 4.0f), Training(), 48);
}

TEST(LayerGradient, FullSelfAttention) {
  SelfAttention layer(6, 3, false);
  CheckGradients(layer, RandomTensor({2, 4, 6}, 9, 4.0f), Training(), 48);
}

TEST(LayerGradient, TransformerBlock) {
  TransformerBlock layer(8, 2, 16, 0.0f, true);
  CheckGradients(layer, RandomTensor({2, 4, 8}, 10), Training(), 32);
}

TEST(LayerGradient, TransformerBlockWithDropout) {
  TransformerBlock layer(8, 2, 16, 0.2f, true);
  CheckGradients(layer, RandomTensor({2, 4, 8}, 11), Training(), 32);
}

TEST(LayerGradient, Conv2d) {
  Conv2d layer({2, 5, 5}, 3, 3, 1, 1, true);
  CheckGradients(layer, RandomTensor({2, 2, 5, 5}, 12), Training(), 32);
}

// The model's first layer (input from data) skips its input gradient:
// the same parameter gradients, bit for bit, and no input gradient.
void ExpectSameParameterGradsWithoutInputGrad(Layer& with, Layer& without,
                                              const Tensor& x) {
  LayerContext ctx = Training();
  Saved s1, s2;
  const Tensor y = with.Forward(x, ctx, &s1);
  without.Forward(x, ctx, &s2);
  const Tensor dy = RandomTensor(y.shape(), 7);
  const Tensor dx = with.Backward(dy, s1, ctx);
  ctx.input_grad = false;
  const Tensor none = without.Backward(dy, s2, ctx);
  EXPECT_TRUE(dx.defined());
  EXPECT_FALSE(none.defined());
  const std::vector<Parameter*> a = with.Parameters(), b = without.Parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(BitwiseEqual(a[i]->grad, b[i]->grad)) << a[i]->name;
}

TEST(LayerGradient, FirstLayersSkipTheInputGradient) {
  Linear l1(6, 3, true), l2(6, 3, true);
  ExpectSameParameterGradsWithoutInputGrad(l1, l2, RandomTensor({4, 6}, 3));
  Conv2d c1({2, 5, 5}, 3, 3, 1, 1, true), c2({2, 5, 5}, 3, 3, 1, 1, true);
  ExpectSameParameterGradsWithoutInputGrad(c1, c2,
                                           RandomTensor({2, 2, 5, 5}, 4));
}

TEST(LayerGradient, Conv2dStrided) {
  Conv2d layer({3, 6, 6}, 2, 3, 2, 0, false);
  CheckGradients(layer, RandomTensor({2, 3, 6, 6}, 13), Training(), 32);
}

TEST(LayerGradient, MaxPool2d) {
  MaxPool2d layer({2, 4, 4}, 2, 2);
  CheckGradients(layer, SpreadTensor({2, 2, 4, 4}, 14), Training());
}

TEST(LayerGradient, GlobalAvgPool) {
  GlobalAvgPool layer({3, 2, 2});
  CheckGradients(layer, RandomTensor({2, 3, 2, 2}, 15), Training());
}

TEST(LayerGradient, Flatten) {
  Flatten layer({2, 3});
  CheckGradients(layer, RandomTensor({2, 2, 3}, 16), Training());
}

TEST(LayerGradient, BatchNormSpatial) {
  BatchNorm layer({3, 2, 2}, 0.1f, 1e-5f);
  CheckGradients(layer, RandomTensor({4, 3, 2, 2}, 17), Training(), 32);
}

TEST(LayerGradient, BatchNormFeatures) {
  BatchNorm layer({5}, 0.1f, 1e-5f);
  CheckGradients(layer, RandomTensor({6, 5}, 18), Training(), 32);
}

TEST(LossGradient, SoftmaxCrossEntropy) {
  Tensor logits = RandomTensor({3, 4, 5}, 19);
  Tensor targets =
      Tensor::FromInts({3, 4}, {0, 4, -1, 2, 1, 1, 3, -1, 0, 2, 4, 3});
  const double normalizer = CountTargets(targets);
  EXPECT_EQ(normalizer, 10);
  Tensor dlogits;
  LossResult r = SoftmaxCrossEntropyLoss(logits, targets, normalizer, &dlogits);
  EXPECT_EQ(r.counted, 10);
  const float eps = 1e-2f;
  for (int64_t i = 0; i < logits.numel(); ++i) {
    const float keep = logits.f32()[i];
    logits.f32()[i] = keep + eps;
    const double plus =
        SoftmaxCrossEntropyLoss(logits, targets, normalizer, nullptr).loss_sum;
    logits.f32()[i] = keep - eps;
    const double minus =
        SoftmaxCrossEntropyLoss(logits, targets, normalizer, nullptr).loss_sum;
    logits.f32()[i] = keep;
    ExpectClose(dlogits.f32()[i], (plus - minus) / (2 * eps) / normalizer,
                "dlogits[" + std::to_string(i) + "]");
  }
}

TEST(Dropout, SameKeySameMask) {
  Dropout layer(0.5f);
  Tensor x = Tensor::Filled({8, 64}, 1.0f);
  LayerContext ctx = Training();
  Tensor a = layer.Forward(x, ctx, nullptr);
  Tensor b = layer.Forward(x, ctx, nullptr);
  EXPECT_TRUE(BitwiseEqual(a, b));
  int64_t dropped = 0;
  for (int64_t i = 0; i < a.numel(); ++i) dropped += a.f32()[i] == 0.0f;
  EXPECT_GT(dropped, a.numel() / 3);
  EXPECT_LT(dropped, 2 * a.numel() / 3);
  ctx.micro_batch += 1;
  EXPECT_FALSE(BitwiseEqual(a, layer.Forward(x, ctx, nullptr)));
  ctx.training = false;
  EXPECT_TRUE(BitwiseEqual(x, layer.Forward(x, ctx, nullptr)));
}

TEST(BatchNorm, RecomputeLeavesRunningStatsAlone) {
  BatchNorm layer({2}, 0.1f, 1e-5f);
  layer.Initialize(1);
  Tensor x = RandomTensor({8, 2}, 20);
  LayerContext ctx = Training();
  layer.Forward(x, ctx, nullptr);
  const Tensor mean = layer.Buffers()[0].value->Clone();
  ctx.recompute = true;
  layer.Forward(x, ctx, nullptr);
  EXPECT_TRUE(BitwiseEqual(mean, *layer.Buffers()[0].value));
}

// Held back and moved later, micro-batch by micro-batch in order, the
// running averages are those the forwards move themselves, bit for bit;
// the held-back forwards leave them alone and normalize the same.
TEST(BatchNorm, HeldBackStatisticsMoveTheAveragesToTheSameBits) {
  BatchNorm inline_layer({3, 2, 2}, 0.1f, 1e-5f), held({3, 2, 2}, 0.1f, 1e-5f);
  inline_layer.Initialize(1);
  held.Initialize(1);
  RunningStatistics log;
  for (int64_t m = 0; m < 4; ++m) {
    const Tensor x = RandomTensor({5, 3, 2, 2}, 30 + m);
    LayerContext ctx = Training();
    ctx.micro_batch = m;
    ctx.layer_index = 7;
    const Tensor a = inline_layer.Forward(x, ctx, nullptr);
    ctx.running_statistics = &log;
    const Tensor b = held.Forward(x, ctx, nullptr);
    EXPECT_TRUE(BitwiseEqual(a, b));
  }
  EXPECT_TRUE(BitwiseEqual(*held.Buffers()[0].value, Tensor::Zeros({3})));
  ASSERT_EQ(held.RunningStatisticsSize(), 6);
  for (int64_t m = 0; m < 4; ++m) {
    const Tensor* record = log.Find(m, 7);
    ASSERT_NE(record, nullptr);
    held.ApplyRunningStatistics(record->f32());
  }
  for (int b = 0; b < 2; ++b) {
    EXPECT_TRUE(BitwiseEqual(*inline_layer.Buffers()[b].value,
                             *held.Buffers()[b].value))
        << held.Buffers()[b].name;
  }
  // Out of order they differ: the test above could not pass by accident.
  BatchNorm reversed({3, 2, 2}, 0.1f, 1e-5f);
  reversed.Initialize(1);
  for (int64_t m = 3; m >= 0; --m)
    reversed.ApplyRunningStatistics(log.Find(m, 7)->f32());
  EXPECT_FALSE(BitwiseEqual(*inline_layer.Buffers()[1].value,
                            *reversed.Buffers()[1].value));
}

}  // namespace
}  // namespace gpipe
