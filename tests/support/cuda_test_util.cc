#include "tests/support/cuda_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "services/core/rng.h"
#include "services/pipeline/job_spec.h"
#include "services/tensor/fake_device.h"

namespace gpipe::cuda_test {

Tensor Random(const Shape& shape, uint64_t key, float scale) {
  Tensor t = Tensor::Empty(shape);
  Rng rng(key);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] = static_cast<float>(rng.Normal() * scale);
  return t;
}

double MaxRelError(const Tensor& expected, const Tensor& actual) {
  const std::vector<float> a = expected.ToVector(), b = actual.ToVector();
  double worst =
      a.size() == b.size() ? 0.0 : std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::fabs(a[i] - b[i]) / (std::fabs(a[i]) + 1.0));
  return worst;
}

double MaxNormwiseError(const Tensor& expected, const Tensor& actual) {
  const std::vector<float> a = expected.ToVector(), b = actual.ToVector();
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(a[i])));
  }
  return diff / (scale + 1.0);
}

void CudaTest::SetUp() {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU: " << CudaDescription();
}

bool RealGpu() { return CudaAvailable() && !FakeDeviceEnabled(); }

void MoveState(Layer& layer, Device device) {
  for (Parameter* p : layer.Parameters()) {
    p->value = p->value.To(device);
    p->grad = p->grad.To(device);
  }
  for (const NamedBuffer& b : layer.Buffers()) *b.value = b.value->To(device);
}

void CompareLayer(Layer& cpu, Layer& gpu, const Shape& input, double tol,
                  bool training) {
  SCOPED_TRACE(std::string(cpu.kind()));
  ASSERT_TRUE(gpu.RunsOn(Device::kCuda));
  cpu.Initialize(77);
  gpu.Initialize(77);
  MoveState(gpu, Device::kCuda);
  LayerContext ctx;
  ctx.training = training;
  ctx.seed = 5;  // dropout masks: the same key on both devices
  ctx.step = 3;
  Tensor x = Random(input, 1);
  Saved s_cpu, s_gpu;
  Tensor y = cpu.Forward(x, ctx, &s_cpu);
  Tensor gy = gpu.Forward(x.To(Device::kCuda), ctx, &s_gpu);
  ASSERT_EQ(gy.device(), Device::kCuda);
  EXPECT_LE(MaxRelError(y, gy), tol) << "forward";
  Tensor dy = Random(y.shape(), 2);
  Tensor dx = cpu.Backward(dy, s_cpu, ctx);
  Tensor gdx = gpu.Backward(dy.To(Device::kCuda), s_gpu, ctx);
  ASSERT_EQ(gdx.device(), Device::kCuda);
  EXPECT_LE(MaxRelError(dx, gdx), tol) << "backward";
  std::vector<Parameter*> pc = cpu.Parameters(), pg = gpu.Parameters();
  for (size_t i = 0; i < pc.size(); ++i)
    EXPECT_LE(MaxRelError(pc[i]->grad, pg[i]->grad), tol) << pc[i]->name;
  std::vector<NamedBuffer> bc = cpu.Buffers(), bg = gpu.Buffers();
  for (size_t i = 0; i < bc.size(); ++i)
    EXPECT_LE(MaxRelError(*bc[i].value, *bg[i].value), tol) << bc[i].name;
}

absl::StatusOr<gpipe::v1::JobSpec> LoadExample(const std::string& file) {
  const char* dir = std::getenv("GPIPE_EXAMPLES");
  return LoadJobSpecFile((dir != nullptr
                              ? std::string(dir)
                              : std::string(GPIPE_SOURCE_DIR) + "/examples") +
                         "/" + file);
}

void ExpectLossesTrack(Trainer& cpu, Trainer& gpu, int steps, double rel) {
  for (int s = 0; s < steps; ++s) {
    absl::StatusOr<StepReport> a = cpu.Step(), b = gpu.Step();
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_NEAR(a->loss, b->loss, rel * (1 + a->loss)) << "step " << s;
  }
}

}  // namespace gpipe::cuda_test
