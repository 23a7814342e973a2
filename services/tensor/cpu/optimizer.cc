#include "services/tensor/cpu/optimizer.h"

#include <cmath>

#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {

// omp simd: every lane does the scalar arithmetic, so the bits are those of
// the plain loop, in the AVX2 clone too (vector_clones.h).
GPIPE_VECTOR_CLONES
void SgdStep(int64_t n, float lr, float decay, float mu, bool nesterov,
             bool first, const float* g, float* w, float* buf) {
  if (buf == nullptr) {
#pragma omp parallel for simd if (parallel : n > (1 << 15))
    for (int64_t j = 0; j < n; ++j) w[j] -= lr * (g[j] + decay * w[j]);
    return;
  }
#pragma omp parallel for simd if (parallel : n > (1 << 15))
  for (int64_t j = 0; j < n; ++j) {
    const float d = g[j] + decay * w[j];
    buf[j] = first ? d : mu * buf[j] + d;
    w[j] -= lr * (nesterov ? d + mu * buf[j] : buf[j]);
  }
}

GPIPE_VECTOR_CLONES
void AdamWStep(int64_t n, float decay, float beta1, float beta2,
               float step_size, float c2_sqrt, float eps, const float* g,
               float* w, float* m, float* v) {
  const float ob1 = 1.0f - beta1, ob2 = 1.0f - beta2;
#pragma omp parallel for simd if (parallel : n > (1 << 15))
  for (int64_t j = 0; j < n; ++j) {
    w[j] *= decay;
    m[j] = beta1 * m[j] + ob1 * g[j];
    v[j] = beta2 * v[j] + ob2 * g[j] * g[j];
    w[j] -= step_size * m[j] / (std::sqrt(v[j]) / c2_sqrt + eps);
  }
}

}  // namespace gpipe::cpu
