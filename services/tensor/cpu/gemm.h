// Dense matrix products on the CPU through OpenBLAS (row-major). Results are
// bitwise independent of the number of compute threads.
#ifndef GPIPE_SERVICES_TENSOR_CPU_GEMM_H_
#define GPIPE_SERVICES_TENSOR_CPU_GEMM_H_

#include <cstdint>

namespace gpipe::cpu {

// C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C, all row-major and
// packed (leading dimensions follow from the shapes).
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c);

// The same with explicit leading dimensions, for strided sub-matrices.
void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const float* a, int64_t lda, const float* b,
                 int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_GEMM_H_
