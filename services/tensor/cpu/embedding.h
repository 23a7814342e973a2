// Embedding lookups and their gradient.
#ifndef GPIPE_SERVICES_TENSOR_CPU_EMBEDDING_H_
#define GPIPE_SERVICES_TENSOR_CPU_EMBEDDING_H_

#include <cstdint>

namespace gpipe::cpu {

// out[i, :] = table[ids[i], :]; ids must already be in range.
void EmbeddingGather(int64_t n, int64_t dim, const int32_t* ids,
                     const float* table, float* out);
// dtable[ids[i], :] += dout[i, :], i in order (deterministic).
void EmbeddingScatterAdd(int64_t n, int64_t dim, const int32_t* ids,
                         const float* dout, float* dtable);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_EMBEDDING_H_
