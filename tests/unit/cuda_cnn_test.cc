// The convolutional kernels and layers on the GPU against the CPU:
// pooling, channel sums and the im2col layout are bitwise the CPU's;
// convolution (cuBLAS sums in another order) within 1e-4 relative; batch
// norm (double sums in a tree instead of in sequence) within 1e-5. The CNN
// example's model trains on the GPU in step with the CPU. Skipped when no
// GPU is present, except the checks that need none.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/nn/layers/batch_norm.h"
#include "services/nn/layers/conv2d.h"
#include "services/nn/layers/pooling.h"
#include "services/nn/model.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/reference_trainer.h"
#include "services/tensor/device.h"
#include "services/tensor/ops.h"
#include "tests/support/cuda_test_util.h"

namespace gpipe::cuda_test {
namespace {

class CudaCnnTest : public CudaTest {};

struct ConvCase {
  cpu::ConvGeometry g;
  int64_t batch, out_channels;
};

// Padding, strides, 1x1, 5x5, and images that are not square.
std::vector<ConvCase> ConvCases() {
  return {{{3, 13, 13, 3, 1, 1}, 5, 8},
          {{4, 11, 9, 3, 2, 0}, 3, 6},
          {{2, 7, 7, 1, 1, 0}, 4, 5},
          {{3, 10, 12, 5, 2, 2}, 2, 7}};
}

TEST_F(CudaCnnTest, Im2ColConvolutionMatchesTheCpu) {
  for (const ConvCase& c : ConvCases()) {
    const cpu::ConvGeometry& g = c.g;
    SCOPED_TRACE("k=" + std::to_string(g.kernel) +
                 " s=" + std::to_string(g.stride));
    const Shape in{c.batch, g.channels, g.height, g.width};
    const Shape out{c.batch, c.out_channels, g.out_height(), g.out_width()};
    Tensor x = Random(in, 1),
           w = Random({c.out_channels, g.channels, g.kernel, g.kernel}, 2,
                      0.3f);
    Tensor bias = Random({c.out_channels}, 3), dy = Random(out, 4);
    Tensor dw = Random(w.shape(), 5), db = Random(bias.shape(), 6);
    Tensor y = Tensor::Empty(out), dx = Tensor::Empty(in);
    Tensor gx = x.To(kCuda), gw = w.To(kCuda), gbias = bias.To(kCuda),
           gdy = dy.To(kCuda), gdw = dw.To(kCuda), gdb = db.To(kCuda),
           gy = y.To(kCuda), gdx = dx.To(kCuda);
    ops::Conv2dForward(kCpu, g, c.batch, c.out_channels, x.f32(), w.f32(),
                       bias.f32(), y.f32());
    ops::Conv2dForward(kCuda, g, c.batch, c.out_channels, gx.f32(), gw.f32(),
                       gbias.f32(), gy.f32(), ops::ConvPath::kIm2Col);
    EXPECT_LE(MaxRelError(y, gy), 1e-4) << "y";
    ops::Conv2dBackward(kCpu, g, c.batch, c.out_channels, x.f32(), w.f32(),
                        dy.f32(), dx.f32(), dw.f32(), db.f32());
    ops::Conv2dBackward(kCuda, g, c.batch, c.out_channels, gx.f32(), gw.f32(),
                        gdy.f32(), gdx.f32(), gdw.f32(), gdb.f32(),
                        ops::ConvPath::kIm2Col);
    EXPECT_LE(MaxRelError(dx, gdx), 1e-4) << "dx";
    EXPECT_LE(MaxRelError(dw, gdw), 1e-4) << "dw";
    EXPECT_TRUE(BitwiseEqual(db, gdb)) << "dbias: the CPU's order of sums";
    // Reproducible: the same call again gives the same bits.
    Tensor again = Tensor::Empty(out, DType::kF32, kCuda);
    ops::Conv2dForward(kCuda, g, c.batch, c.out_channels, gx.f32(), gw.f32(),
                       gbias.f32(), again.f32(), ops::ConvPath::kIm2Col);
    EXPECT_TRUE(BitwiseEqual(gy, again));
  }
}

// Inputs on a coarse grid, so windows hold ties (the first maximum wins on
// both devices).
Tensor Coarse(const Shape& shape, uint64_t key) {
  Tensor t = Random(shape, key);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] = std::round(t.f32()[i] * 2.0f) / 2.0f;
  return t;
}

TEST_F(CudaCnnTest, PoolingIsBitwiseTheCpu) {
  const int64_t planes = 6, h = 9, w = 11;
  Tensor x = Coarse({planes, h, w}, 7), gx = x.To(kCuda);
  // Disjoint windows, overlapping windows (inputs chosen twice), stride 1.
  for (auto [k, s] : {std::pair<int64_t, int64_t>{2, 2}, {3, 2}, {3, 1}}) {
    SCOPED_TRACE("k=" + std::to_string(k) + " s=" + std::to_string(s));
    const int64_t oh = (h - k) / s + 1, ow = (w - k) / s + 1;
    Tensor y = Tensor::Empty({planes, oh, ow}), gy = y.To(kCuda);
    Tensor arg = Tensor::Empty({planes, oh, ow}, DType::kI32),
           garg = arg.To(kCuda);
    ops::MaxPool2dForward(kCpu, planes, h, w, k, s, x.f32(), y.f32(),
                          arg.i32());
    ops::MaxPool2dForward(kCuda, planes, h, w, k, s, gx.f32(), gy.f32(),
                          garg.i32());
    EXPECT_TRUE(BitwiseEqual(y, gy));
    EXPECT_TRUE(BitwiseEqual(arg, garg));
    Tensor dy = Random(y.shape(), 8), gdy = dy.To(kCuda);
    Tensor dx = Tensor::Empty(x.shape()), gdx = dx.To(kCuda);
    ops::MaxPool2dBackward(kCpu, planes, h, w, k, s, dy.f32(), arg.i32(),
                           dx.f32());
    ops::MaxPool2dBackward(kCuda, planes, h, w, k, s, gdy.f32(), garg.i32(),
                           gdx.f32());
    EXPECT_TRUE(BitwiseEqual(dx, gdx));
  }
  Tensor avg = Tensor::Empty({planes}), gavg = avg.To(kCuda);
  ops::GlobalAvgPoolForward(kCpu, planes, h * w, x.f32(), avg.f32());
  ops::GlobalAvgPoolForward(kCuda, planes, h * w, gx.f32(), gavg.f32());
  EXPECT_TRUE(BitwiseEqual(avg, gavg));
  Tensor dx = Tensor::Empty(x.shape()), gdx = dx.To(kCuda);
  ops::GlobalAvgPoolBackward(kCpu, planes, h * w, avg.f32(), dx.f32());
  ops::GlobalAvgPoolBackward(kCuda, planes, h * w, gavg.f32(), gdx.f32());
  EXPECT_TRUE(BitwiseEqual(dx, gdx));
}

TEST_F(CudaCnnTest, BatchNormMatchesTheCpu) {
  const int64_t batch = 7, channels = 5, inner = 300;
  const Shape shape{batch, channels, inner};
  Tensor x = Random(shape, 9, 3.0f), dy = Random(shape, 10);
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] += 2.0f;  // mean != 0
  Tensor gamma = Random({channels}, 11), beta = Random({channels}, 12);
  Tensor rm = Random({channels}, 13), rv = Tensor::Filled({channels}, 1.5f);
  Tensor gx = x.To(kCuda), gdy = dy.To(kCuda), ggamma = gamma.To(kCuda),
         gbeta = beta.To(kCuda), grm = rm.To(kCuda), grv = rv.To(kCuda);
  for (bool batch_stats : {true, false}) {
    SCOPED_TRACE(batch_stats ? "training" : "evaluation");
    Tensor y = Tensor::Empty(shape), mean = Tensor::Empty({channels}),
           rstd = Tensor::Empty({channels});
    Tensor gy = y.To(kCuda), gmean = mean.To(kCuda), grstd = rstd.To(kCuda);
    ops::BatchNormForward(kCpu, batch, channels, inner, batch_stats, true, 0.1f,
                          1e-5f, x.f32(), gamma.f32(), beta.f32(), rm.f32(),
                          rv.f32(), y.f32(), mean.f32(), rstd.f32());
    ops::BatchNormForward(kCuda, batch, channels, inner, batch_stats, true,
                          0.1f, 1e-5f, gx.f32(), ggamma.f32(), gbeta.f32(),
                          grm.f32(), grv.f32(), gy.f32(), gmean.f32(),
                          grstd.f32());
    EXPECT_LE(MaxRelError(y, gy), 1e-5) << "y";
    EXPECT_LE(MaxRelError(mean, gmean), 1e-6) << "mean";
    EXPECT_LE(MaxRelError(rstd, grstd), 1e-6) << "rstd";
    EXPECT_LE(MaxRelError(rm, grm), 1e-6) << "running mean";
    EXPECT_LE(MaxRelError(rv, grv), 1e-6) << "running var";
    Tensor dx = Tensor::Empty(shape), gdx = dx.To(kCuda);
    Tensor dg = Random({channels}, 14), db = Random({channels}, 15);
    Tensor gdg = dg.To(kCuda), gdb = db.To(kCuda);
    ops::BatchNormBackward(kCpu, batch, channels, inner, x.f32(), mean.f32(),
                           rstd.f32(), gamma.f32(), dy.f32(), dx.f32(),
                           dg.f32(), db.f32());
    // From the CPU's saved values, so only the backward is compared.
    Tensor cmean = mean.To(kCuda), crstd = rstd.To(kCuda);
    ops::BatchNormBackward(kCuda, batch, channels, inner, gx.f32(), cmean.f32(),
                           crstd.f32(), ggamma.f32(), gdy.f32(), gdx.f32(),
                           gdg.f32(), gdb.f32());
    EXPECT_LE(MaxRelError(dx, gdx), 1e-5) << "dx";
    EXPECT_LE(MaxRelError(dg, gdg), 1e-5) << "dgamma";
    EXPECT_LE(MaxRelError(db, gdb), 1e-5) << "dbeta";
  }
}

TEST_F(CudaCnnTest, Layers) {
  Conv2d a({3, 12, 12}, 8, 3, 1, 1, true), b({3, 12, 12}, 8, 3, 1, 1, true);
  CompareLayer(a, b, {4, 3, 12, 12}, 1e-4);
  Conv2d c({2, 9, 9}, 4, 3, 2, 0, false), d({2, 9, 9}, 4, 3, 2, 0, false);
  CompareLayer(c, d, {3, 2, 9, 9}, 1e-4);
  MaxPool2d e({3, 8, 8}, 2, 2), f({3, 8, 8}, 2, 2);
  CompareLayer(e, f, {4, 3, 8, 8}, 0);
  GlobalAvgPool g({3, 5, 7}), h({3, 5, 7});
  CompareLayer(g, h, {4, 3, 5, 7}, 0);
  BatchNorm i({6, 5, 5}, 0.1f, 1e-5f), j({6, 5, 5}, 0.1f, 1e-5f);
  CompareLayer(i, j, {8, 6, 5, 5}, 1e-5);
  BatchNorm k({10}, 0.1f, 1e-5f), l({10}, 0.1f, 1e-5f);
  CompareLayer(k, l, {16, 10}, 1e-5);
  // Fresh copies: Initialize writes on the host.
  BatchNorm m({10}, 0.1f, 1e-5f), n({10}, 0.1f, 1e-5f);
  CompareLayer(m, n, {16, 10}, 1e-5, /*training=*/false);
}

// The CNN example's model (conv, batch norm, pooling, linear, dropout) on
// synthetic images: Model::To(kCuda) takes it and the first steps track the
// CPU's.
TEST_F(CudaCnnTest, CnnExampleStepsTrackTheCpu) {
  absl::StatusOr<gpipe::v1::JobSpec> spec =
      LoadExample("fashion_mnist_cnn.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  gpipe::v1::Synthetic* data = spec->mutable_data()->mutable_synthetic();
  data->set_task(gpipe::v1::CLASSES);
  data->set_features(784);
  data->set_classes(10);
  data->set_train_samples(512);
  data->set_test_samples(128);
  spec->set_batch_size(32);
  spec->mutable_pipeline()->set_micro_batches(2);
  auto cpu = ReferenceTrainer::Create(*spec, 0, nullptr, kCpu);
  auto gpu = ReferenceTrainer::Create(*spec, 0, nullptr, kCuda);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ExpectLossesTrack(**cpu, **gpu, 4, 1e-3);
  if (HasFatalFailure()) return;
  absl::StatusOr<EvalResult> ea = (*cpu)->Evaluate(Split::kTest);
  absl::StatusOr<EvalResult> eb = (*gpu)->Evaluate(Split::kTest);
  ASSERT_TRUE(ea.ok() && eb.ok());
  EXPECT_NEAR(ea->loss, eb->loss, 1e-2 * (1 + ea->loss));
}

// Runs everywhere: the cuDNN switch explains itself.
TEST(CudnnSwitchTest, DescriptionSaysWhy) {
  const std::string why = ops::CudnnDescription();
  std::printf("cuDNN: %s\n", why.c_str());
  EXPECT_FALSE(why.empty());
  if (ops::CudnnSelected())
    EXPECT_EQ(why.rfind("cuDNN ", 0), 0u) << why;
  else
    EXPECT_NE(why.rfind("cuDNN ", 0), 0u) << why;
}

}  // namespace
}  // namespace gpipe::cuda_test
