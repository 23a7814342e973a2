// gpu_bench: the CUDA backend's figures on the machine's GPU. First cuBLAS's
// own sgemm peak (large square products), then our GEMM (ops::Gemm on
// device tensors) on the shapes the benchmark models issue, as a share of
// that peak; the CNN example's two convolutions (forward + backward) by our
// im2col + cuBLAS path and by cuDNN when it loads; then ms per training step
// of the reference trainer on the GPU for each job spec given (compare with
// bench/device_check.sh's PyTorch run of the same model).
//
//   gpu_bench [SPEC.json...] [--steps N] [--warmup W] [--profile]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/args.h"
#include "bench/step_profile.h"
#include "bench/timing.h"
#include "services/data/sampler.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/reference_trainer.h"
#include "services/tensor/device.h"
#include "services/tensor/ops.h"

namespace gpipe::bench {
namespace {

// TFLOP/s of C = A B^T (the Linear forward) for m x n x k, median of reps.
double GemmTflops(int64_t m, int64_t n, int64_t k, int reps) {
  Tensor a = Tensor::Zeros({m, k}, DType::kF32, Device::kCuda);
  Tensor b = Tensor::Zeros({n, k}, DType::kF32, Device::kCuda);
  Tensor c = Tensor::Zeros({m, n}, DType::kF32, Device::kCuda);
  auto run = [&] {
    ops::Gemm(Device::kCuda, false, true, m, n, k, 1.0f, a.f32(), b.f32(), 0.0f,
              c.f32());
  };
  run();
  SynchronizeCuda();
  // Small products are timed in batches so launch latency is averaged.
  const int inner = std::max<int64_t>(1, 1e10 / (2.0 * m * n * k + 1));
  std::vector<double> secs;
  for (int r = 0; r < reps; ++r) {
    secs.push_back(TimeSeconds([&] {
                     for (int i = 0; i < std::min(inner, 200); ++i) run();
                     SynchronizeCuda();
                   }) /
                   std::min(inner, 200));
  }
  return 2.0 * m * n * k / Median(secs) / 1e12;
}

// ms of one convolution's forward + backward (median of reps) by `path`.
double ConvMs(const cpu::ConvGeometry& g, int64_t batch, int64_t cout,
              ops::ConvPath path, int reps) {
  const int64_t in = batch * g.channels * g.height * g.width;
  const int64_t out = batch * cout * g.out_height() * g.out_width();
  const int64_t wn = cout * g.channels * g.kernel * g.kernel;
  Tensor x = Tensor::Zeros({in}, DType::kF32, Device::kCuda);
  Tensor dx = Tensor::Zeros({in}, DType::kF32, Device::kCuda);
  Tensor y = Tensor::Zeros({out}, DType::kF32, Device::kCuda);
  Tensor w = Tensor::Zeros({wn}, DType::kF32, Device::kCuda);
  Tensor dw = Tensor::Zeros({wn}, DType::kF32, Device::kCuda);
  Tensor b = Tensor::Zeros({cout}, DType::kF32, Device::kCuda);
  Tensor db = Tensor::Zeros({cout}, DType::kF32, Device::kCuda);
  auto run = [&] {
    ops::Conv2dForward(Device::kCuda, g, batch, cout, x.f32(), w.f32(), b.f32(),
                       y.f32(), path);
    ops::Conv2dBackward(Device::kCuda, g, batch, cout, x.f32(), w.f32(),
                        y.f32(), dx.f32(), dw.f32(), db.f32(), path);
  };
  run();
  SynchronizeCuda();
  std::vector<double> secs;
  for (int r = 0; r < reps; ++r) {
    secs.push_back(TimeSeconds([&] {
                     for (int i = 0; i < 20; ++i) run();
                     SynchronizeCuda();
                   }) /
                   20);
  }
  return 1e3 * Median(secs);
}

int Run(const Args& args) {
  if (!CudaAvailable()) {
    std::printf("gpu_bench: no GPU (%s)\n", CudaDescription().c_str());
    return 1;
  }
  std::printf("device: %s\n", CudaDescription().c_str());
  double peak = 0;
  for (int64_t n : {4096, 8192}) {
    const double t = GemmTflops(n, n, n, 5);
    std::printf("cublas sgemm %ld^3: %.2f TFLOP/s\n", static_cast<long>(n), t);
    peak = std::max(peak, t);
  }
  std::printf("sgemm peak: %.2f TFLOP/s (fp32, no TF32)\n", peak);
  struct Shape3 {
    int64_t m, n, k;
    const char* what;
  };
  const Shape3 shapes[] = {
      {128, 256, 784, "mlp fc1 fwd (batch 128)"},
      {128, 10, 128, "mlp fc3 fwd"},
      {1024, 4096, 1024, "wide mlp fc1 fwd (batch 1024)"},
      {1024, 4096, 4096, "wide mlp fc2 fwd"},
      {4096, 4096, 1024, "wide mlp fc2 weight grad"},
  };
  for (const Shape3& s : shapes) {
    const double t = GemmTflops(s.m, s.n, s.k, 5);
    std::printf("gemm %5ld x %5ld x %5ld  %6.2f TFLOP/s  %5.1f%% of peak  %s\n",
                static_cast<long>(s.m), static_cast<long>(s.n),
                static_cast<long>(s.k), t, 100.0 * t / peak, s.what);
  }
  std::printf("cuDNN: %s\n", ops::CudnnDescription().c_str());
  struct ConvCase {
    cpu::ConvGeometry g;
    int64_t cout;
    const char* what;
  };
  const ConvCase convs[] = {
      {{1, 28, 28, 3, 1, 1}, 16, "cnn conv1 (1->16, 28x28)"},
      {{16, 14, 14, 3, 1, 1}, 32, "cnn conv2 (16->32, 14x14)"}};
  for (const ConvCase& c : convs) {
    const double own = ConvMs(c.g, 128, c.cout, ops::ConvPath::kIm2Col, 5);
    if (ops::CudnnUsable()) {
      const double dnn = ConvMs(c.g, 128, c.cout, ops::ConvPath::kCudnn, 5);
      std::printf("conv fwd+bwd batch 128 %s: im2col %.3f ms, cuDNN %.3f ms\n",
                  c.what, own, dnn);
    } else {
      std::printf("conv fwd+bwd batch 128 %s: im2col %.3f ms\n", c.what, own);
    }
  }
  const long steps = std::max(1L, args.Int("steps", 50));
  const long warmup = std::max(1L, args.Int("warmup", 5));
  for (const std::string& path : args.positional()) {
    absl::StatusOr<gpipe::v1::JobSpec> spec = LoadJobSpecFile(path);
    if (!spec.ok()) {
      std::fprintf(stderr, "gpu_bench: %s\n",
                   std::string(spec.status().message()).c_str());
      return 1;
    }
    spec->set_steps(warmup + steps);
    auto trainer = ReferenceTrainer::Create(*spec, 0, nullptr, Device::kCuda);
    if (!trainer.ok()) {
      std::fprintf(stderr, "gpu_bench: %s\n",
                   std::string(trainer.status().message()).c_str());
      return 1;
    }
    double loss = 0;
    for (long i = 0; i < warmup; ++i) loss = (*trainer)->Step()->loss;
    std::vector<double> secs;
    for (long i = 0; i < steps; ++i) {
      secs.push_back(TimeSeconds([&] { loss = (*trainer)->Step()->loss; }));
    }
    std::printf(
        "gpu step %s: ms/step %.3f (median of %ld; mean %.3f), "
        "loss %.4f\n",
        path.c_str(), 1e3 * Median(secs), steps, 1e3 * Mean(secs), loss);
    // The host side of a step: the batch gathered from the dataset and its
    // copy to the device (part of the figure above, not of PyTorch's).
    absl::StatusOr<std::unique_ptr<Dataset>> data = OpenJobDataset(*spec);
    if (!data.ok()) return 1;
    Sampler sampler(spec->seed(), (*data)->size(Split::kTrain),
                    spec->batch_size());
    std::vector<double> gather, copy;
    for (int i = 0; i < 10; ++i) {
      Batch b;
      gather.push_back(TimeSeconds(
          [&] { b = (*data)->Gather(Split::kTrain, sampler.Indices(i)); }));
      copy.push_back(TimeSeconds([&] {
        Tensor d = b.inputs.To(Device::kCuda);
        SynchronizeCuda();
      }));
    }
    std::printf(
        "  of which host batch gather %.3f ms, copy to device %.3f "
        "ms\n",
        1e3 * Median(gather), 1e3 * Median(copy));
    // Layer by layer, each piece waiting for its kernels: where the device
    // time goes (the steps above are not instrumented).
    if (args.Has("profile")) PrintProfile(ProfileSteps(**trainer, 5));
  }
  return 0;
}

}  // namespace
}  // namespace gpipe::bench

int main(int argc, char** argv) {
  gpipe::bench::Args args(argc, argv, {"steps", "warmup"}, {"profile"});
  if (!args.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", args.error().c_str());
    return 2;
  }
  return gpipe::bench::Run(args);
}
