#include "services/tensor/cpu/elementwise.h"

#include <algorithm>
#include <cmath>

#include "services/core/rng.h"
#include "services/tensor/cpu/dropout_avx2.h"
#include "services/tensor/cpu/dropout_avx512.h"
#include "services/tensor/cpu/normal.h"
#include "services/tensor/cpu/tanh.h"
#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {
namespace {
// The element-wise loops are `omp simd`: at -O2, GCC vectorizes a loop only
// when it needs no alias checks, so without it ReLU ran scalar with a
// mispredicted branch per element (1.5 ms for 256 x 1024 floats, 30x the
// memory time). Each lane does the scalar arithmetic, so results are the
// same bits; and the same again in the AVX2 clones (vector_clones.h).
// Below this many elements a parallel region costs more than it saves. The
// `if` names `parallel`: an `if` without it applies to `simd` too (OpenMP
// 5.0), and tensors below the bound ran scalar, a GELU of 4096 floats at
// 5.1 ns an element against 0.4 vectorized (bench/README.md).
constexpr int64_t kParallelMin = 1 << 15;
}  // namespace

GPIPE_VECTOR_CLONES
void Add(int64_t n, const float* a, const float* b, float* out) {
#pragma omp parallel for simd if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

GPIPE_VECTOR_CLONES
void AddInPlace(int64_t n, const float* x, float* y) {
#pragma omp parallel for simd if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

GPIPE_VECTOR_CLONES
void Axpy(int64_t n, float alpha, const float* x, float* y) {
#pragma omp parallel for simd if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

GPIPE_VECTOR_CLONES
void Scale(int64_t n, float alpha, float* x) {
#pragma omp parallel for simd if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

GPIPE_VECTOR_CLONES
void Multiply(int64_t n, const float* a, const float* b, float* out) {
#pragma omp parallel for simd if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

GPIPE_VECTOR_CLONES
void AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y) {
#pragma omp parallel for if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

GPIPE_VECTOR_CLONES
void AddChannelBias(int64_t n, int64_t channels, int64_t inner,
                    const float* bias, float* y) {
#pragma omp parallel for if (n * channels * inner > kParallelMin)
  for (int64_t nc = 0; nc < n * channels; ++nc) {
    const float b = bias[nc % channels];
    float* p = y + nc * inner;
#pragma omp simd
    for (int64_t i = 0; i < inner; ++i) p[i] += b;
  }
}

GPIPE_VECTOR_CLONES
void ReluForward(int64_t n, const float* x, float* y) {
#pragma omp parallel for simd if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

GPIPE_VECTOR_CLONES
void ReluBackward(int64_t n, const float* y, const float* dy, float* dx) {
#pragma omp parallel for simd if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];  // read either way, so the select vectorizes
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

// The exact GELU through cpu/normal.h's Phi and phi (vectorized).
GPIPE_VECTOR_CLONES
void GeluForward(int64_t n, const float* x, float* y) {
#pragma omp parallel for simd if (parallel : n > kParallelMin / 8)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * Normal(x[i]).cdf;
}

GPIPE_VECTOR_CLONES
void GeluBackward(int64_t n, const float* x, const float* dy, float* dx) {
#pragma omp parallel for simd if (parallel : n > kParallelMin / 8)
  for (int64_t i = 0; i < n; ++i) {
    const NormalAt v = Normal(x[i]);
    dx[i] = dy[i] * (v.cdf + x[i] * v.pdf);
  }
}

GPIPE_VECTOR_CLONES
void TanhForward(int64_t n, const float* x, float* y) {
#pragma omp parallel for simd if (parallel : n > kParallelMin / 8)
  for (int64_t i = 0; i < n; ++i) y[i] = Tanh(x[i]);
}

GPIPE_VECTOR_CLONES
void TanhBackward(int64_t n, const float* y, const float* dy, float* dx) {
#pragma omp parallel for simd if (parallel : n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

namespace {
// The mask is UniformAt(key, i) >= p: one SplitMix64 mix an element, whose
// 64-bit multiplies bound the loop (it ran one element at a time, 10% of
// the triad in elementwise_bench, before it was among the vector clones).
GPIPE_VECTOR_CLONES
void DropoutVectorized(int64_t n, float p, uint64_t key, const float* x,
                       float* y) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for simd if (parallel : n > kParallelMin / 4)
  for (int64_t i = 0; i < n; ++i)
    y[i] = UniformAt(key, static_cast<uint64_t>(i)) >= p ? x[i] * scale : 0.0f;
}
}  // namespace

void DropoutForward(int64_t n, float p, uint64_t key, const float* x,
                    float* y) {
  const bool avx512 = DropoutHasAvx512();
  if (!avx512 && !DropoutPrefersAvx2())
    return DropoutVectorized(n, p, key, x, y);
  // Blocks a thread, each the same bits as the whole.
  constexpr int64_t kBlock = int64_t{1} << 14;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for if (n > kParallelMin / 4)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, end = std::min(n, (b + 1) * kBlock);
    if (avx512) {
      DropoutRangeAvx512(begin, end, p, key, x, y);
    } else {
      DropoutRangeAvx2(begin, end, p, key, x, y);
    }
  }
}

void DropoutBackward(int64_t n, float p, uint64_t key, const float* dy,
                     float* dx) {
  DropoutForward(n, p, key, dy, dx);
}

}  // namespace gpipe::cpu
