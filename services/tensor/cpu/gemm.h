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

// C[m,n] = A[m,k] * W[n,k]^T (a Linear layer's product) where every row of
// C is a function of its row of A alone: each element is summed over k in
// order, whatever m is. OpenBLAS's results change with m (its kernels
// differ by block shape), so incremental decoding, which runs one row
// where a whole-sequence forward ran T, uses this for both to agree
// bitwise. Rows run in parallel; slower than Gemm at large m.
void GemmRowStable(int64_t m, int64_t n, int64_t k, const float* a,
                   const float* w, float* c);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_GEMM_H_
