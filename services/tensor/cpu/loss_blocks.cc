#include "services/tensor/cpu/loss_blocks.h"

#include <limits>

#include "services/tensor/cpu/table_exp.h"

namespace gpipe::cpu {
namespace {

float PlainLargest(int64_t n, const float* x) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

void PlainExps(int64_t n, const float* x, float shift, float* out,
               float* lanes) {
  for (int64_t j = 0; j < n; ++j) {
    const float e = TableExp(x[j] - shift);
    if (out != nullptr) out[j] = e;
    lanes[j % kLossLanes] += e;
  }
}

constexpr LossBlockKernels kPlain = {"plain", PlainLargest, PlainExps};

#if defined(__x86_64__) && defined(__GNUC__)
bool HasAvx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") != 0;
}
bool HasAvx2Fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0 &&
         __builtin_cpu_supports("fma") != 0;
}
#else
bool HasAvx512() { return false; }
bool HasAvx2Fma() { return false; }
#endif

}  // namespace

std::vector<const LossBlockKernels*> LossBlocksThisCpuRuns() {
  std::vector<const LossBlockKernels*> runs = {&kPlain};
  if (LossBlocksAvx2() != nullptr && HasAvx2Fma())
    runs.push_back(LossBlocksAvx2());
  if (LossBlocksAvx512() != nullptr && HasAvx512())
    runs.push_back(LossBlocksAvx512());
  return runs;
}

const LossBlockKernels& LossBlocksForThisCpu() {
  static const LossBlockKernels* const widest = LossBlocksThisCpuRuns().back();
  return *widest;
}

}  // namespace gpipe::cpu
