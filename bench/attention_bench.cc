// Causal self-attention's forward and backward (cpu::AttentionForward and
// AttentionBackward) on the size suite's Transformer shapes, against our
// GEMM tile's peak in the same run: the products per (sample, head) are
// small (t x t x dh), so packing, edge tiles and the calls around each
// tile weigh more than in a layer's GEMM. GFLOP/s counts the products'
// multiply-adds where the causal mask leaves them (half of each t x t
// product), the ideal the tiles could reach; the share of the tile's peak
// is that over the peak.
//   attention_bench [--threads T] [--reps R]
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench/args.h"
#include "bench/peak.h"
#include "bench/timing.h"
#include "services/core/rng.h"
#include "services/tensor/cpu/attention.h"

namespace gpipe::bench {
namespace {

struct Shape {
  const char* name;
  int64_t batch, heads, t, dim;
};

int Main(int argc, char** argv) {
  const Args args(argc, argv, {"threads", "reps"});
  if (!args.ok() || !args.positional().empty()) {
    std::fprintf(stderr,
                 "%s\nusage: attention_bench [--threads T] [--reps R]\n",
                 args.error().c_str());
    return 2;
  }
  const int threads = static_cast<int>(args.Int("threads", 1));
  const int reps = static_cast<int>(args.Int("reps", 15));
  if (threads < 1 || reps < 1) {
    std::fprintf(stderr, "--threads and --reps must be positive\n");
    return 2;
  }
  omp_set_num_threads(threads);
  const TilePeak peak = MeasureTilePeak(threads);
  std::printf(
      "attention_bench: %d thread(s), best of %d; tile peak (%s, data in "
      "L1): %.1f GFLOP/s\n",
      threads, reps, peak.tile, peak.gflops);
  std::printf("%-22s %10s %10s %12s %12s\n", "shape (b x h, t, dh)", "fwd ms",
              "bwd ms", "fwd of peak", "bwd of peak");
  // bench/transformer_lm.json's and transformer_lm_512.json's blocks.
  const Shape shapes[] = {{"lm d=256", 32, 4, 128, 256},
                          {"lm_512 d=512", 16, 8, 256, 512}};
  for (const Shape& s : shapes) {
    const int64_t d = s.dim, dh = d / s.heads;
    std::vector<float> qkv(s.batch * s.t * 3 * d), dout(s.batch * s.t * d);
    std::vector<float> probs(s.batch * s.heads * s.t * s.t);
    std::vector<float> out(s.batch * s.t * d), dqkv(qkv.size());
    for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = UniformAt(1, i) - 0.5f;
    for (size_t i = 0; i < dout.size(); ++i) dout[i] = UniformAt(2, i) - 0.5f;
    const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
    double forward = 1e30, backward = 1e30;
    for (int r = 0; r < reps; ++r) {
      forward = std::min(forward, TimeSeconds([&] {
                           cpu::AttentionForward(s.batch, s.heads, s.t, d, true,
                                                 scale, qkv.data(),
                                                 probs.data(), out.data());
                         }));
      backward =
          std::min(backward, TimeSeconds([&] {
                     cpu::AttentionBackward(s.batch, s.heads, s.t, d, true,
                                            scale, qkv.data(), probs.data(),
                                            dout.data(), dqkv.data());
                   }));
    }
    // Q K^T and P V forward, four such products backward, each half kept
    // by the mask: 2 t^2 dh multiply-adds a product, halved.
    const double product =
        static_cast<double>(s.batch * s.heads) * s.t * s.t * dh;
    const double fwd_gflops = 2 * product / forward / 1e9;
    const double bwd_gflops = 4 * product / backward / 1e9;
    std::printf(
        "%-8s %4lld x %lld, %lld, %lld %9.2f %10.2f %11.0f%% %11.0f%%\n",
        s.name, static_cast<long long>(s.batch),
        static_cast<long long>(s.heads), static_cast<long long>(s.t),
        static_cast<long long>(dh), forward * 1e3, backward * 1e3,
        100 * fwd_gflops / peak.gflops, 100 * bwd_gflops / peak.gflops);
  }
  return 0;
}

}  // namespace
}  // namespace gpipe::bench

int main(int argc, char** argv) { return gpipe::bench::Main(argc, argv); }
