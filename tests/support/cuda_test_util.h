// What the CUDA tests (tests/unit/cuda_*_test.cc) share: random inputs,
// the relative error they are judged by, the fixture that skips without a
// GPU, and the layer and training-run comparisons of the CPU against the
// GPU. It compiles and links without CUDA: the tests then skip.
#ifndef GPIPE_TESTS_SUPPORT_CUDA_TEST_UTIL_H_
#define GPIPE_TESTS_SUPPORT_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "gtest/gtest.h"
#include "services/nn/layer.h"
#include "services/pipeline/trainer.h"
#include "services/tensor/device.h"
#include "services/tensor/tensor.h"

namespace gpipe::cuda_test {

// The tests live in this namespace too, so they use these names as they
// are.
inline constexpr Device kCpu = Device::kCpu, kCuda = Device::kCuda;

// Normal(0, scale) values drawn from `key`, on the host.
Tensor Random(const Shape& shape, uint64_t key, float scale = 1.0f);

// The largest |a - b| / (|a| + 1) over the elements, `expected` and
// `actual` read back to the host; infinity when their sizes differ.
double MaxRelError(const Tensor& expected, const Tensor& actual);
// max |a - b| over (max |a| + 1): for long sums that may cancel, whose
// small elements carry the rounding of their large terms.
double MaxNormwiseError(const Tensor& expected, const Tensor& actual);

// A fixture whose tests skip, saying why, where no GPU is present.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// A GPU and not the fake device (services/tensor/fake_device.h): what only
// the hardware has (bf16 tensor-core GEMMs, cuDNN, CUDA IPC between
// processes).
bool RealGpu();

// Moves a layer's parameters, their gradients and its buffers to `device`.
void MoveState(Layer& layer, Device device);

// Forward and backward of two copies of a layer (the same initialization
// and dropout key), `cpu` on the host and `gpu` moved to the GPU: output,
// input gradient, parameter gradients and buffers within `tol`.
void CompareLayer(Layer& cpu, Layer& gpu, const Shape& input, double tol,
                  bool training = true);

// The job spec examples/`file` of our tree, or of $GPIPE_EXAMPLES (where
// the examples are on a machine without our tree).
absl::StatusOr<gpipe::v1::JobSpec> LoadExample(const std::string& file);

// `steps` steps of both trainers; each GPU loss within `rel` * (1 + the
// CPU's loss) of the CPU's.
void ExpectLossesTrack(Trainer& cpu, Trainer& gpu, int steps, double rel);

}  // namespace gpipe::cuda_test

#endif  // GPIPE_TESTS_SUPPORT_CUDA_TEST_UTIL_H_
