// The optional cuDNN convolution against our im2col + cuBLAS one on the
// same GPU: within 1e-4 relative (both are fp32 without TF32, summing in
// different orders; the filter gradient relative to its largest element), and
// reproducible run after run (deterministic algorithms only). Skipped without a
// GPU or without a loadable cuDNN 9.
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/tensor/device.h"
#include "services/tensor/ops.h"
#include "services/tensor/tensor.h"
#include "tests/support/cuda_test_util.h"

namespace gpipe::cuda_test {
namespace {

using ops::ConvPath;

// The shared inputs, on the GPU (both convolutions run there).
Tensor GpuRandom(const Shape& shape, uint64_t key, float scale = 1.0f) {
  return Random(shape, key, scale).To(kCuda);
}

class CudaCudnnTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    std::printf("cuDNN: %s\n", ops::CudnnDescription().c_str());
    if (!ops::CudnnUsable())
      GTEST_SKIP() << "no cuDNN: " << ops::CudnnDescription();
  }
};

struct Result {
  Tensor y, dx, dw, db;
};

Result RunConv(ConvPath path, const cpu::ConvGeometry& g, int64_t batch,
               int64_t cout) {
  const Shape in{batch, g.channels, g.height, g.width};
  const Shape out{batch, cout, g.out_height(), g.out_width()};
  Tensor x = GpuRandom(in, 1),
         w = GpuRandom({cout, g.channels, g.kernel, g.kernel}, 2, 0.3f);
  Tensor bias = GpuRandom({cout}, 3), dy = GpuRandom(out, 4);
  Result r{Tensor::Empty(out, DType::kF32, kCuda),
           Tensor::Empty(in, DType::kF32, kCuda), GpuRandom(w.shape(), 5),
           GpuRandom({cout}, 6)};
  ops::Conv2dForward(kCuda, g, batch, cout, x.f32(), w.f32(), bias.f32(),
                     r.y.f32(), path);
  ops::Conv2dBackward(kCuda, g, batch, cout, x.f32(), w.f32(), dy.f32(),
                      r.dx.f32(), r.dw.f32(), r.db.f32(), path);
  return r;
}

TEST_F(CudaCudnnTest, MatchesIm2ColAndIsReproducible) {
  struct Case {
    cpu::ConvGeometry g;
    int64_t batch, cout;
  };
  // The CNN example's two layers at its batch size, strides, 1x1, 5x5 and
  // images that are not square.
  const std::vector<Case> cases = {{{1, 28, 28, 3, 1, 1}, 64, 16},
                                   {{16, 14, 14, 3, 1, 1}, 64, 32},
                                   {{4, 11, 9, 3, 2, 0}, 3, 6},
                                   {{2, 7, 7, 1, 1, 0}, 4, 5},
                                   {{3, 10, 12, 5, 2, 2}, 2, 7}};
  for (const Case& c : cases) {
    SCOPED_TRACE("C=" + std::to_string(c.g.channels) +
                 " k=" + std::to_string(c.g.kernel) +
                 " s=" + std::to_string(c.g.stride));
    const Result own = RunConv(ConvPath::kIm2Col, c.g, c.batch, c.cout);
    const Result dnn = RunConv(ConvPath::kCudnn, c.g, c.batch, c.cout);
    EXPECT_LE(MaxRelError(own.y, dnn.y), 1e-4) << "y";
    EXPECT_LE(MaxRelError(own.dx, dnn.dx), 1e-4) << "dx";
    // dw sums batch x output pixels products (50176 in the first case):
    // where they cancel, an element is far smaller than the rounding of its
    // terms, so it is compared against the largest element instead.
    EXPECT_LE(MaxNormwiseError(own.dw, dnn.dw), 1e-4) << "dw";
    EXPECT_TRUE(BitwiseEqual(own.db, dnn.db)) << "dbias: our kernel on both";
    const Result again = RunConv(ConvPath::kCudnn, c.g, c.batch, c.cout);
    EXPECT_TRUE(BitwiseEqual(dnn.y, again.y));
    EXPECT_TRUE(BitwiseEqual(dnn.dx, again.dx));
    EXPECT_TRUE(BitwiseEqual(dnn.dw, again.dw));
  }
}

}  // namespace
}  // namespace gpipe::cuda_test
