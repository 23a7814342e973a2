// The cross-entropy's two passes over a block of a row's logits (its largest
// logit; its exps and their sum), written for each vector width: the table
// exp's lookup is one permute in a vector register, which GCC's clones of a
// plain loop made 16 scalar loads.
#ifndef GPIPE_SERVICES_TENSOR_CPU_LOSS_BLOCKS_H_
#define GPIPE_SERVICES_TENSOR_CPU_LOSS_BLOCKS_H_

#include <cstdint>
#include <vector>

namespace gpipe::cpu {

// A row's sum of exps goes into 32 lanes, element j of the row into lane
// j % 32, added in a fixed tree at the end (AddLossLanes): the same bits at
// every vector width, and 32 independent chains of adds instead of one.
inline constexpr int kLossLanes = 32;

// One implementation of the passes. Every one gives the same bits: exps by
// TableExp's operations in its order, each lane's adds in element order.
struct LossBlockKernels {
  const char* name;
  // The largest of x[0..n) but NaNs (-inf for none), n >= 1. Which zero it
  // gives for a largest zero depends on the order: callers add +0.
  float (*largest)(int64_t n, const float* x);
  // For j in [0, n): e = TableExp(x[j] - shift) added to lanes[j % 32] and,
  // where `out` is not null, written to out[j]. x[0] is lane 0's. No lane
  // may hold -0 (the vector kernels add +0 to the lanes past n, which
  // leaves every other value as it is); a sum of exps from +0 never does.
  void (*exps)(int64_t n, const float* x, float shift, float* out,
               float* lanes);
};

// The widest this CPU runs (AVX-512, AVX2 with FMA, else plain C++),
// chosen once.
const LossBlockKernels& LossBlocksForThisCpu();

// Every implementation this CPU runs, the plain one first: tests compare
// them.
std::vector<const LossBlockKernels*> LossBlocksThisCpuRuns();

// The lanes' sum: lane l, l + 8, l + 16 and l + 24 first, then the eight
// of those in a tree.
[[gnu::always_inline]] inline float AddLossLanes(const float* lanes) {
  float t[8];
  for (int l = 0; l < 8; ++l)
    t[l] = (lanes[l] + lanes[l + 8]) + (lanes[l + 16] + lanes[l + 24]);
  return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

// The vector implementations, null where the build has none
// (loss_blocks_avx512.cc, loss_blocks_avx2.cc); they do not check the CPU.
const LossBlockKernels* LossBlocksAvx512();
const LossBlockKernels* LossBlocksAvx2();

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_LOSS_BLOCKS_H_
