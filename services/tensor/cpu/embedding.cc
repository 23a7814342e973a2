#include "services/tensor/cpu/embedding.h"

#include <cstring>

namespace gpipe::cpu {

void EmbeddingGather(int64_t n, int64_t dim, const int32_t* ids,
                     const float* table, float* out) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * dim, table + static_cast<int64_t>(ids[i]) * dim,
                dim * sizeof(float));
}

void EmbeddingScatterAdd(int64_t n, int64_t dim, const int32_t* ids,
                         const float* dout, float* dtable) {
  for (int64_t i = 0; i < n; ++i) {
    float* row = dtable + static_cast<int64_t>(ids[i]) * dim;
    const float* g = dout + i * dim;
    for (int64_t d = 0; d < dim; ++d) row[d] += g[d];
  }
}

}  // namespace gpipe::cpu
