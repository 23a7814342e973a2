// Element-wise kernels on one tensor against a triad (c = a + s b) over
// the same buffers, in the same run and thread count: GELU (bound by its
// arithmetic), ReLU, an add (bound by memory) and dropout (its mask a
// hash of each element's index), tanh and the loss. Each kernel's GB/s counts
// the least traffic it must move (each input read once, the output written
// once); the share of the triad is that over the triad's GB/s.
//   elementwise_bench [--floats N] [--threads T] [--reps R]
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/args.h"
#include "bench/timing.h"
#include "services/core/rng.h"
#include "services/tensor/cpu/elementwise.h"
#include "services/tensor/cpu/softmax.h"

namespace gpipe::bench {
namespace {

struct Kernel {
  std::string name;
  int64_t bytes_per_float;  // inputs read plus the output written
  std::function<void()> run;
  int64_t floats = 0;  // 0: the tensor's
};

int Main(int argc, char** argv) {
  const Args args(argc, argv, {"floats", "threads", "reps"});
  if (!args.ok() || !args.positional().empty()) {
    std::fprintf(stderr,
                 "%s\nusage: elementwise_bench [--floats N] "
                 "[--threads T] [--reps R]\n",
                 args.error().c_str());
    return 2;
  }
  const int64_t n = args.Int("floats", int64_t{4} << 20);
  const int threads = static_cast<int>(args.Int("threads", 1));
  const int reps = static_cast<int>(args.Int("reps", 15));
  if (n < 1 || threads < 1 || reps < 1) {
    std::fprintf(stderr, "--floats, --threads and --reps must be positive\n");
    return 2;
  }
  omp_set_num_threads(threads);
  // Activations as a layer sees them: roughly normal, most within +-4.
  std::vector<float> x(n), dy(n), y(n), dx(n);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = 4.0f * (UniformAt(1, i) - 0.5f) + 2.0f * (UniformAt(2, i) - 0.5f);
    dy[i] = UniformAt(3, i) - 0.5f;
  }
  // The loss of a language model over a 32000-token vocabulary: its
  // logits read and its gradient written.
  constexpr int64_t kVocab = 32000;
  const int64_t rows = std::max<int64_t>(1, n / kVocab);
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r)
    targets[r] = static_cast<int32_t>(UniformAt(4, r) * kVocab) % kVocab;
  const std::vector<Kernel> kernels = {
      {"gelu forward", 8, [&] { cpu::GeluForward(n, x.data(), y.data()); }},
      {"gelu backward", 12,
       [&] { cpu::GeluBackward(n, x.data(), dy.data(), dx.data()); }},
      {"relu forward", 8, [&] { cpu::ReluForward(n, x.data(), y.data()); }},
      {"relu backward", 12,
       [&] { cpu::ReluBackward(n, x.data(), dy.data(), dx.data()); }},
      {"tanh forward", 8, [&] { cpu::TanhForward(n, x.data(), y.data()); }},
      {"tanh backward", 12,
       [&] { cpu::TanhBackward(n, x.data(), dy.data(), dx.data()); }},
      {"add", 12, [&] { cpu::Add(n, x.data(), dy.data(), y.data()); }},
      {"cross-entropy", 8,
       [&] {
         cpu::SoftmaxCrossEntropy(rows, std::min(n, kVocab), x.data(),
                                  targets.data(), 1.0, dx.data());
       },
       rows * std::min(n, kVocab)},
      {"cross-entropy, loss only", 4,
       [&] {
         cpu::SoftmaxCrossEntropy(rows, std::min(n, kVocab), x.data(),
                                  targets.data(), 1.0, nullptr);
       },
       rows * std::min(n, kVocab)},
      {"dropout", 8,
       [&] { cpu::DropoutForward(n, 0.1f, 7, x.data(), y.data()); }},
  };
  // The triad runs on the kernels' own buffers, so it finds them where
  // they find them (this machine's cache may hold a few tensors of this
  // size), and alternates with them, so a neighbour's load shifts both.
  const auto triad = [&] {
    const float* a = x.data();
    const float* b = dy.data();
    float* c = y.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) c[i] = a[i] + 3.0f * b[i];
  };
  double triad_s = 1e30;
  std::vector<double> best(kernels.size(), 1e30);
  for (int r = 0; r < reps; ++r) {
    triad_s = std::min(triad_s, TimeSeconds(triad));
    for (size_t k = 0; k < kernels.size(); ++k) {
      best[k] = std::min(best[k], TimeSeconds(kernels[k].run));
    }
  }
  const double triad_gbs = 12.0 * static_cast<double>(n) / triad_s / 1e9;
  std::printf("%lld floats (%.1f MiB a tensor), %d thread(s), best of %d\n",
              static_cast<long long>(n), 4.0 * n / (1 << 20), threads, reps);
  std::printf("triad: %.3f ms, %.1f GB/s\n", triad_s * 1e3, triad_gbs);
  std::printf("%-24s %9s %8s %9s\n", "kernel", "ms", "GB/s", "of triad");
  for (size_t k = 0; k < kernels.size(); ++k) {
    const double gbs =
        static_cast<double>(kernels[k].bytes_per_float *
                            (kernels[k].floats > 0 ? kernels[k].floats : n)) /
        best[k] / 1e9;
    std::printf("%-24s %9.3f %8.1f %8.0f%%\n", kernels[k].name.c_str(),
                best[k] * 1e3, gbs, 100 * gbs / triad_gbs);
  }
  return 0;
}

}  // namespace
}  // namespace gpipe::bench

int main(int argc, char** argv) { return gpipe::bench::Main(argc, argv); }
