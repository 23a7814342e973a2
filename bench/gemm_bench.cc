// gemm_bench: how close our GEMM calls come to the machine's sgemm peak.
// Measures the OpenBLAS peak on a large square product, then times
// gpipe::cpu::Gemm on exactly the shapes the example models issue (the same
// transposes, leading dimensions and beta as Linear and Conv2d use), and
// prints each one's GFLOP/s and its ratio to the peak.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/args.h"
#include "bench/peak.h"
#include "bench/timing.h"
#include "services/core/cores.h"
#include "services/tensor/cpu/gemm.h"
#include "services/tensor/threads.h"

namespace gpipe::bench {
namespace {

// One Gemm call as a layer issues it: C[m,n] = op(A) op(B) + beta C.
struct GemmCase {
  std::string model;  // which example and batch
  std::string what;   // layer and pass
  bool trans_a, trans_b;
  int64_t m, n, k;
  float beta;
};

// Linear(in -> out) on `rows` rows: y = x W^T, dW += dy^T x, dx = dy W
// (services/nn/layers/linear.cc).
void AddLinear(std::vector<GemmCase>& cases, const std::string& model,
               const std::string& name, int64_t rows, int64_t in, int64_t out) {
  const std::string layer = absl::StrFormat("%s %d->%d", name, in, out);
  cases.push_back({model, layer + " fwd", false, true, rows, out, in, 0.0f});
  cases.push_back({model, layer + " dW", true, false, out, in, rows, 1.0f});
  cases.push_back({model, layer + " dX", false, false, rows, in, out, 0.0f});
}

// Conv2d(cin -> cout, k x k, stride 1, padding k/2) through im2col, one chunk
// of samples per GEMM (services/tensor/conv_ops.cc; the chunk rule mirrors
// its ChunkSize on the CPU: about 2M floats of im2col columns per chunk).
void AddConv(std::vector<GemmCase>& cases, const std::string& model,
             const std::string& name, int64_t batch, int64_t cin, int64_t hw_in,
             int64_t cout, int64_t k) {
  const int64_t hw = hw_in * hw_in, ckk = cin * k * k;
  const int64_t chunk =
      std::clamp<int64_t>((2 << 20) / std::max<int64_t>(ckk * hw, 1), 1, batch);
  std::vector<int64_t> sizes = {chunk};
  if (batch % chunk != 0 && batch > chunk) sizes.push_back(batch % chunk);
  for (int64_t nb : sizes) {
    const std::string layer =
        absl::StrFormat("%s %d->%d chunk %d", name, cin, cout, nb);
    const int64_t ld = nb * hw;
    cases.push_back({model, layer + " fwd", false, false, cout, ld, ckk, 0.0f});
    cases.push_back({model, layer + " dW", false, true, cout, ckk, ld, 1.0f});
    cases.push_back({model, layer + " dcol", true, false, ckk, ld, cout, 0.0f});
  }
}

// The GEMMs of examples/*.json at their batch sizes divided by `m`.
std::vector<GemmCase> ModelCases(int64_t m) {
  std::vector<GemmCase> cases;
  const int64_t mlp_rows = 128 / m;
  const std::string mlp = absl::StrFormat("mlp B=%d", mlp_rows);
  AddLinear(cases, mlp, "fc0", mlp_rows, 784, 256);
  AddLinear(cases, mlp, "fc2", mlp_rows, 256, 128);
  AddLinear(cases, mlp, "fc4", mlp_rows, 128, 10);

  const int64_t tok_rows = 64 * 16 / m;  // batch 64, 16 tokens
  const std::string lm = absl::StrFormat("transformer BT=%d", tok_rows);
  AddLinear(cases, lm, "qkv", tok_rows, 64, 192);
  AddLinear(cases, lm, "proj", tok_rows, 64, 64);
  AddLinear(cases, lm, "fc1", tok_rows, 64, 256);
  AddLinear(cases, lm, "fc2", tok_rows, 256, 64);
  AddLinear(cases, lm, "head", tok_rows, 64, 17);

  const int64_t cnn_batch = 128 / m;
  const std::string cnn = absl::StrFormat("cnn B=%d", cnn_batch);
  AddConv(cases, cnn, "conv0", cnn_batch, 1, 28, 16, 3);
  AddConv(cases, cnn, "conv4", cnn_batch, 16, 14, 32, 3);
  AddLinear(cases, cnn, "fc9", cnn_batch, 1568, 128);
  AddLinear(cases, cnn, "fc12", cnn_batch, 128, 10);
  return cases;
}

struct CaseResult {
  double median_s = 0.0;  // per call
  double gflops = 0.0;    // at the median
};

// Repeats the call in groups of about a millisecond for `min_seconds`, and
// reports the median time per call.
CaseResult TimeCase(const GemmCase& g, double min_seconds) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(g.m * g.k), b(g.k * g.n), c(g.m * g.n);
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  for (float& v : c) v = u(rng) * 1e-3f;
  auto once = [&] {
    cpu::Gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, a.data(), b.data(),
              g.beta, c.data());
  };
  const double first = TimeSeconds(once);  // warm-up
  const int64_t group = std::clamp<int64_t>(
      static_cast<int64_t>(1e-3 / std::max(first, 1e-9)), 1, 10000);
  std::vector<double> per_call;
  double spent = 0.0;
  while (spent < min_seconds || per_call.size() < 5) {
    const double s = TimeSeconds([&] {
      for (int64_t i = 0; i < group; ++i) once();
    });
    per_call.push_back(s / group);
    spent += s;
  }
  CaseResult r;
  r.median_s = Median(per_call);
  r.gflops = 2.0 * g.m * g.n * g.k / r.median_s / 1e9;
  return r;
}

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "(unset)";
}

// Says so when the library runs on fewer OpenMP threads than asked for.
void WarnThreads(int asked) {
  if (ComputeThreads() != asked) {
    std::printf(
        "warning: SetComputeThreads(%d) left ComputeThreads() at %d: "
        "our kernels and GEMM panels run on %d thread(s)\n",
        asked, ComputeThreads(), ComputeThreads());
  }
}

constexpr char kUsage[] =
    "usage: gemm_bench [--threads N] [--micro-batches M] [--min-seconds S]\n"
    "  --threads N        compute threads (default: the usable cores)\n"
    "  --micro-batches M  divide every batch by M, as a run with M "
    "micro-batches\n"
    "                     does (default 1: whole batches)\n"
    "  --min-seconds S    time spent on each shape (default 0.1)\n";

int Run(const Args& args) {
  const long threads_flag = args.Int("threads", 0);
  const int threads = threads_flag > 0 ? static_cast<int>(threads_flag)
                                       : gpipe::AvailableCores();
  const int64_t m = std::max<long>(1, args.Int("micro-batches", 1));
  const double min_seconds = args.Double("min-seconds", 0.1);
  SetComputeThreads(threads);
  std::printf(
      "gemm_bench: --threads %d, ComputeThreads() %d, "
      "OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s\n",
      threads, ComputeThreads(), Env("OPENBLAS_CORETYPE"),
      Env("OPENBLAS_L2_SIZE"));
  WarnThreads(threads);
  const SgemmPeak peak = MeasureSgemmPeak(threads);
  std::printf(
      "peak: cblas_sgemm %lldx%lldx%lld on %d OpenBLAS threads, best "
      "of %d: %.1f GFLOP/s (%.1f ms)\n\n",
      static_cast<long long>(peak.size), static_cast<long long>(peak.size),
      static_cast<long long>(peak.size), peak.threads, peak.reps, peak.gflops,
      peak.best_s * 1e3);
  std::printf("%-20s %-28s %-3s %6s %6s %6s %10s %8s %6s\n", "model", "gemm",
              "op", "m", "n", "k", "us/call", "GFLOP/s", "/peak");
  std::string last_model;
  for (const GemmCase& g : ModelCases(m)) {
    const CaseResult r = TimeCase(g, min_seconds);
    if (g.model != last_model && !last_model.empty()) std::printf("\n");
    last_model = g.model;
    std::printf("%-20s %-28s %c,%c %6lld %6lld %6lld %10.1f %8.1f %5.0f%%\n",
                g.model.c_str(), g.what.c_str(), g.trans_a ? 'T' : 'N',
                g.trans_b ? 'T' : 'N', static_cast<long long>(g.m),
                static_cast<long long>(g.n), static_cast<long long>(g.k),
                r.median_s * 1e6, r.gflops, 100.0 * r.gflops / peak.gflops);
    std::fflush(stdout);
  }
  std::printf("\nafter the GEMMs: ComputeThreads() %d\n", ComputeThreads());
  std::printf(
      "\nHow to read: each row is one cpu::Gemm call exactly as the layer "
      "issues it\n"
      "(names carry the spec's layer index; op = transposes of A,B, "
      "row-major; dW\n"
      "accumulates with beta=1). us/call and GFLOP/s (2mnk per call) are "
      "medians over\n"
      "~%.2fs per row; /peak divides by the cblas_sgemm peak above, taken on "
      "all\n"
      "--threads. A row near 1/threads of the peak is running on one core; "
      "shapes with\n"
      "a dimension below ~32 (the 10- and 17-wide heads, the first conv's "
      "k = 9) lose\n"
      "to packing and call overhead whatever the threads.\n",
      min_seconds);
  return 0;
}

}  // namespace
}  // namespace gpipe::bench

int main(int argc, char** argv) {
  using gpipe::bench::Args;
  const Args args(argc, argv, {"threads", "micro-batches", "min-seconds"});
  if (!args.ok() || !args.positional().empty()) {
    std::fprintf(stderr, "gemm_bench: %s\n%s",
                 args.ok() ? "no positional arguments" : args.error().c_str(),
                 gpipe::bench::kUsage);
    return 2;
  }
  return gpipe::bench::Run(args);
}
