// Products over a short depth, as a first convolution makes them: its
// columns (im2col) have channels x k^2 rows, 9 for a grey image under a
// 3 x 3 kernel. The blocked GEMM (gemm.h) packs both operands and runs
// 12 x 32 register tiles for a few multiply-adds per element, and for the
// weight gradient packs each sample's columns and output gradient again;
// these run straight from the operands: the forward product and the weight
// gradient's. Each element is the same chain of fused multiply-adds, over
// the depth in order, that the GEMM computes, so the bits do not depend on
// which runs.
#ifndef GPIPE_SERVICES_TENSOR_CPU_SHALLOW_PRODUCT_H_
#define GPIPE_SERVICES_TENSOR_CPU_SHALLOW_PRODUCT_H_

#include <cstdint>

namespace gpipe::cpu {

// Whether a product of this depth runs here rather than through the GEMM.
bool ShallowDepth(int64_t depth);

// y[i, j] = (w[i, :] . col[:, j]) + bias[i] for i < rows, j < n: the dot
// product one chain of fused multiply-adds from +0 over the depth in order,
// as Gemm(beta = 0) makes it, then the bias added as a separate add (none
// where bias is null). w is rows x depth; col's rows are ldcol apart, y's
// ldy.
void ShallowProduct(int64_t rows, int64_t n, int64_t depth, const float* w,
                    const float* col, int64_t ldcol, const float* bias,
                    float* y, int64_t ldy);

// The transposed weight gradient of a shallow product over one sample:
// dwt[t, c] += col[t, :] . dy[c, :] for t < depth, c < channels, each
// element's chain of fused multiply-adds continuing from dwt's value over
// the positions j < n in order, as Gemm(beta = 1) of col and dy^T makes it.
// col's and dy's rows are ld apart; dwt is depth x channels. Runs where the
// CPU has AVX-512, depth <= kShallowGradientTaps and 15 ld fits the
// gather's 32-bit offsets, and returns false without touching dwt where not
// (the caller runs the GEMM).
inline constexpr int64_t kShallowGradientTaps = 16;
bool ShallowWeightGradient(int64_t depth, int64_t channels, int64_t n,
                           const float* col, const float* dy, int64_t ld,
                           float* dwt);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_SHALLOW_PRODUCT_H_
