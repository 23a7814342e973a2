// gemm_bench: how close our GEMM calls come to the machine's peak and to
// OpenBLAS. Measures OpenBLAS's peak on a large square product and our
// register tile's peak on data in L1, then times gpipe::cpu::Gemm on
// exactly the shapes the example models (or, with --suite sizes, models at
// the sizes users train) issue (the same transposes, leading dimensions and
// beta as Linear and Conv2d use), and prints each one's GFLOP/s, its ratio
// to both peaks and to one plain cblas_sgemm call on the same shape and
// threads, timed in alternation with ours.
#include <cblas.h>

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
  // A causal attention product (beta 0) computes only this triangle.
  cpu::GemmTriangle triangle = cpu::GemmTriangle::kFull;
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

// Conv2d(cin -> cout, k x k, stride 1, padding k/2) through im2col, one
// sample per GEMM, as services/tensor/conv_ops.cc issues them on the CPU:
// the forward, dW (as its transpose where that fills the tiles better) and
// the column gradients of dX.
void AddConv(std::vector<GemmCase>& cases, const std::string& model,
             const std::string& name, int64_t cin, int64_t hw_in, int64_t cout,
             int64_t k) {
  const int64_t hw = hw_in * hw_in, ckk = cin * k * k;
  const std::string layer =
      absl::StrFormat("%s %d->%d a sample", name, cin, cout);
  cases.push_back({model, layer + " fwd", false, false, cout, hw, ckk, 0.0f});
  if (cpu::TransposeFillsTilesBetter(cout, ckk)) {
    cases.push_back({model, layer + " dW^T", false, true, ckk, cout, hw, 1.0f});
  } else {
    cases.push_back({model, layer + " dW", false, true, cout, ckk, hw, 1.0f});
  }
  cases.push_back({model, layer + " dcol", true, false, ckk, hw, cout, 0.0f});
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
  AddConv(cases, cnn, "conv0", 1, 28, 16, 3);
  AddConv(cases, cnn, "conv4", 16, 14, 32, 3);
  AddLinear(cases, cnn, "fc9", cnn_batch, 1568, 128);
  AddLinear(cases, cnn, "fc12", cnn_batch, 128, 10);
  return cases;
}

// The Linear layers of the models in bench/*.json that users' sizes are
// measured on (compare_torch.sh's size suite), batch divided by `m`.
std::vector<GemmCase> SizeCases(int64_t m) {
  std::vector<GemmCase> cases;
  const int64_t rows = 256 / m;  // both MLPs: batch 256
  const std::string mlp1 = absl::StrFormat("mlp1024 B=%d", rows);
  AddLinear(cases, mlp1, "fc0", rows, 784, 1024);
  AddLinear(cases, mlp1, "fc", rows, 1024, 1024);
  AddLinear(cases, mlp1, "head", rows, 1024, 10);
  const std::string mlp4 = absl::StrFormat("mlp4096 B=%d", rows);
  AddLinear(cases, mlp4, "fc0", rows, 784, 4096);
  AddLinear(cases, mlp4, "fc", rows, 4096, 4096);
  // Transformer blocks: dim 256 at batch 32 x seq 128, dim 512 at batch
  // 16 x seq 256: 4096 token rows either way.
  for (int64_t dim : {256, 512}) {
    const int64_t tokens = 4096 / m;
    const std::string lm = absl::StrFormat("lm d=%d BT=%d", dim, tokens);
    AddLinear(cases, lm, "qkv", tokens, dim, 3 * dim);
    AddLinear(cases, lm, "proj", tokens, dim, dim);
    AddLinear(cases, lm, "fc1", tokens, dim, 4 * dim);
    AddLinear(cases, lm, "fc2", tokens, 4 * dim, dim);
  }
  // Causal attention per (sample, head), dim 256 (t = 128) and 512
  // (t = 256), 64 per head (services/tensor/cpu/attention.cc): S = Q K^T and
  // dP = dO V^T keep the lower half; O = P V and dQ = dS K have a lower
  // triangular A; dV = P^T dO and dK = dS^T Q an upper one.
  for (auto [dim, t] : {std::pair<int64_t, int64_t>{256, 128}, {512, 256}}) {
    const std::string lm = absl::StrFormat("lm d=%d a head", dim);
    const int64_t dh = 64;
    using cpu::GemmTriangle;
    cases.push_back({lm, "causal QK^T, dO V^T", false, true, t, t, dh, 0.0f,
                     GemmTriangle::kLowerOutput});
    cases.push_back({lm, "causal P V, dS K", false, false, t, dh, t, 0.0f,
                     GemmTriangle::kLowerA});
    cases.push_back({lm, "causal P^T dO, dS^T Q", true, false, t, dh, t, 0.0f,
                     GemmTriangle::kUpperA});
  }
  return cases;
}

struct CaseResult {
  double median_s = 0.0;        // per call
  double gflops = 0.0;          // at the median
  double plain_median_s = 0.0;  // one cblas_sgemm on `threads` threads
  double plain_gflops = 0.0;
  // Ours with op(B) packed ahead (cpu::PackedB, as a Linear layer keeps its
  // weight across a step's micro-batches, packed for their rows); 0 where A
  // is transposed (dW).
  double packed_gflops = 0.0;
  // The same, each call on another of copies of B that together outgrow
  // the caches (`cold_bytes`), as a training step's layers take their
  // weights from memory in turn; 0 where not packed or not asked for.
  double cold_gflops = 0.0;
};

// Repeats our call and the plain one in alternating groups of about a
// millisecond for `min_seconds` each (so both see the same noise), and
// reports each one's median time per call. The plain call runs OpenBLAS on
// `threads` of its own threads, as a user calling it would (and back on one
// between, so its idle threads do not spin beside ours); ours runs on
// `threads` OpenMP threads.
CaseResult TimeCase(const GemmCase& g, int threads, double min_seconds,
                    int64_t cold_bytes) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(g.m * g.k), b(g.k * g.n), c(g.m * g.n);
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  for (float& v : c) v = u(rng) * 1e-3f;
  auto ours = [&] {
    if (g.triangle != cpu::GemmTriangle::kFull) {
      cpu::GemmTriangular(g.triangle, g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f,
                          a.data(), g.trans_a ? g.m : g.k, b.data(),
                          g.trans_b ? g.k : g.n, c.data(), g.n);
      return;
    }
    cpu::Gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, 1.0f, a.data(), b.data(),
              g.beta, c.data());
  };
  auto plain = [&] {
    cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, 1.0f,
                a.data(), g.trans_a ? g.m : g.k, b.data(),
                g.trans_b ? g.k : g.n, g.beta, c.data(), g.n);
  };
  cpu::PackedB packed;
  if (!g.trans_a && g.triangle == cpu::GemmTriangle::kFull) {
    packed.Pack(g.trans_b, g.k, g.n, b.data(), g.trans_b ? g.k : g.n, g.m);
  }
  auto ours_packed = [&] {
    cpu::GemmPackedB(g.m, 1.0f, a.data(), g.k, packed, g.beta, c.data(), g.n);
  };
  std::vector<cpu::PackedB> cold;
  if (packed.packed() && cold_bytes > 0) {
    const int64_t copies =
        std::max<int64_t>(2, cold_bytes / std::max<int64_t>(1, 4 * g.k * g.n));
    cold.resize(copies);
    for (cpu::PackedB& p : cold)
      p.Pack(g.trans_b, g.k, g.n, b.data(), g.trans_b ? g.k : g.n, g.m);
  }
  size_t next_cold = 0;
  auto ours_cold = [&] {
    cpu::GemmPackedB(g.m, 1.0f, a.data(), g.k, cold[next_cold], g.beta,
                     c.data(), g.n);
    next_cold = (next_cold + 1) % cold.size();
  };
  auto group_of = [](double first) {
    return std::clamp<int64_t>(
        static_cast<int64_t>(1e-3 / std::max(first, 1e-9)), 1, 10000);
  };
  const int64_t group = group_of(TimeSeconds(ours));  // and a warm-up
  openblas_set_num_threads(threads);
  const int64_t plain_group = group_of(TimeSeconds(plain));
  openblas_set_num_threads(1);
  std::vector<double> per_call, plain_per_call, packed_per_call, cold_per_call;
  double spent = 0.0;
  // `count` calls of `call`, timed together: the seconds per call go to
  // `out`, the whole to `spent`.
  const auto time_group = [&](auto& call, int64_t count,
                              std::vector<double>& out) {
    const double s = TimeSeconds([&] {
      for (int64_t i = 0; i < count; ++i) call();
    });
    out.push_back(s / count);
    spent += s;
  };
  while (spent < 2 * min_seconds || per_call.size() < 5) {
    time_group(ours, group, per_call);
    openblas_set_num_threads(threads);
    time_group(plain, plain_group, plain_per_call);
    openblas_set_num_threads(1);
    if (packed.packed()) time_group(ours_packed, group, packed_per_call);
    if (!cold.empty()) time_group(ours_cold, group, cold_per_call);
  }
  const double flops = 2.0 * g.m * g.n * g.k;
  CaseResult r;
  r.median_s = Median(per_call);
  r.gflops = flops / r.median_s / 1e9;
  r.plain_median_s = Median(plain_per_call);
  r.plain_gflops = flops / r.plain_median_s / 1e9;
  if (!packed_per_call.empty())
    r.packed_gflops = flops / Median(packed_per_call) / 1e9;
  if (!cold_per_call.empty())
    r.cold_gflops = flops / Median(cold_per_call) / 1e9;
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
    "                  [--suite examples|sizes] [--cold-mib C] [--only NAME]\n"
    "  --threads N        compute threads (default: the usable cores)\n"
    "  --micro-batches M  divide every batch by M, as a run with M "
    "micro-batches\n"
    "                     does (default 1: whole batches)\n"
    "  --min-seconds S    time spent on each shape (default 0.1)\n"
    "  --suite S          examples: the shapes of examples/*.json (default);\n"
    "                     sizes: the Linears of bench/mlp_1024.json, a\n"
    "                     width-4096 MLP and Transformer blocks of dim 256 "
    "and 512,\n"
    "                     and their causal attention's products per head\n"
    "  --cold-mib C       the cold column cycles packed copies of B over C "
    "MiB\n"
    "                     (default 1024: past this machine's caches; 0: "
    "none)\n"
    "  --only NAME        only the models whose name contains NAME\n";

int Run(const Args& args) {
  const long threads_flag = args.Int("threads", 0);
  const int threads = threads_flag > 0 ? static_cast<int>(threads_flag)
                                       : gpipe::AvailableCores();
  const int64_t m = std::max<long>(1, args.Int("micro-batches", 1));
  const double min_seconds = args.Double("min-seconds", 0.1);
  const std::string suite = args.Str("suite", "examples");
  const std::string only = args.Str("only", "");
  const int64_t cold_bytes =
      std::max<long>(0, args.Int("cold-mib", 1024)) * (int64_t{1} << 20);
  if (suite != "examples" && suite != "sizes") {
    std::fprintf(stderr, "gemm_bench: --suite is examples or sizes, not %s\n",
                 suite.c_str());
    return 2;
  }
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
      "of %d: %.1f GFLOP/s (%.1f ms)\n",
      static_cast<long long>(peak.size), static_cast<long long>(peak.size),
      static_cast<long long>(peak.size), peak.threads, peak.reps, peak.gflops,
      peak.best_s * 1e3);
  const TilePeak tile = MeasureTilePeak(threads);
  std::printf(
      "tile peak: our %s tile on data in L1, %d threads: %.1f GFLOP/s\n\n",
      tile.tile, tile.threads, tile.gflops);
  std::printf("%-20s %-28s %-3s %6s %6s %6s %10s %8s %6s %6s %8s %8s %8s\n",
              "model", "gemm", "op", "m", "n", "k", "us/call", "GFLOP/s",
              "/peak", "/tile", "/plain", "packedB", "cold");
  std::string last_model;
  double flops = 0.0, ours_s = 0.0, plain_s = 0.0;
  for (const GemmCase& g : suite == "sizes" ? SizeCases(m) : ModelCases(m)) {
    if (!only.empty() && g.model.find(only) == std::string::npos) continue;
    const CaseResult r = TimeCase(g, threads, min_seconds, cold_bytes);
    if (g.model != last_model && !last_model.empty()) std::printf("\n");
    last_model = g.model;
    std::printf(
        "%-20s %-28s %c,%c %6lld %6lld %6lld %10.1f %8.1f %5.0f%% %5.0f%% "
        "%7.0f%% %8s %8s\n",
        g.model.c_str(), g.what.c_str(), g.trans_a ? 'T' : 'N',
        g.trans_b ? 'T' : 'N', static_cast<long long>(g.m),
        static_cast<long long>(g.n), static_cast<long long>(g.k),
        r.median_s * 1e6, r.gflops, 100.0 * r.gflops / peak.gflops,
        100.0 * r.gflops / tile.gflops, 100.0 * r.gflops / r.plain_gflops,
        r.packed_gflops > 0 ? absl::StrFormat("%.1f", r.packed_gflops).c_str()
                            : "-",
        r.cold_gflops > 0 ? absl::StrFormat("%.1f", r.cold_gflops).c_str()
                          : "-");
    std::fflush(stdout);
    if (g.triangle != cpu::GemmTriangle::kFull) continue;  // not like for like
    flops += 2.0 * g.m * g.n * g.k;
    ours_s += r.median_s;
    plain_s += r.plain_median_s;
  }
  std::printf(
      "\nall full rows, one call each: ours %.1f GFLOP/s (%.0f%% of the cblas "
      "peak, %.0f%% of the tile peak), plain cblas_sgemm %.1f GFLOP/s: ours "
      "at %.0f%% of plain\n",
      flops / ours_s / 1e9, 100.0 * flops / ours_s / 1e9 / peak.gflops,
      100.0 * flops / ours_s / 1e9 / tile.gflops, flops / plain_s / 1e9,
      100.0 * plain_s / ours_s);
  std::printf("\nafter the GEMMs: ComputeThreads() %d\n", ComputeThreads());
  std::printf(
      "\nHow to read: each row is one cpu::Gemm call exactly as the layer "
      "issues it\n"
      "(names carry the spec's layer index; op = transposes of A,B, "
      "row-major; dW\n"
      "accumulates with beta=1). us/call and GFLOP/s (2mnk per call) are "
      "medians over\n"
      "~%.2fs per row; /peak divides by the cblas_sgemm peak above, /tile by "
      "our tile's\n"
      "peak, both taken on all --threads. A row near 1/threads of a peak is "
      "running on\n"
      "one core; shapes with\n"
      "a dimension below ~32 (the 10- and 17-wide heads, the first conv's "
      "k = 9) lose\n"
      "to packing and call overhead whatever the threads. /plain divides by "
      "one\n"
      "cblas_sgemm on the same shape with OpenBLAS on --threads threads, "
      "timed in\n"
      "alternation with ours (OpenBLAS's kernel is the one it picks for this "
      "CPU,\n"
      "or OPENBLAS_CORETYPE's). packedB: ours with B packed ahead, as a "
      "Linear\n"
      "keeps its weight; cold: the same with each call on the next of copies "
      "of B\n"
      "spanning --cold-mib, as a training step's layers find their weights "
      "in memory.\n"
      "The causal attention rows count the full product's 2mnk, which plain "
      "computes;\n"
      "ours skips the half the mask zeroes, so /plain above 100%% is the "
      "saving.\n",
      min_seconds);
  return 0;
}

}  // namespace
}  // namespace gpipe::bench

int main(int argc, char** argv) {
  using gpipe::bench::Args;
  const Args args(
      argc, argv,
      {"threads", "micro-batches", "min-seconds", "suite", "cold-mib", "only"});
  if (!args.ok() || !args.positional().empty()) {
    std::fprintf(stderr, "gemm_bench: %s\n%s",
                 args.ok() ? "no positional arguments" : args.error().c_str(),
                 gpipe::bench::kUsage);
    return 2;
  }
  return gpipe::bench::Run(args);
}
