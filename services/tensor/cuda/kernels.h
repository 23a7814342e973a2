// The CUDA kernel set: the same signatures and the same arithmetic order as
// the CPU kernels in ../cpu/, on device pointers, queued on the thread's
// current stream (runtime.h). Built with --fmad=false, so kernels without
// transcendental functions round exactly as the CPU does; reductions have a
// fixed order (no atomics), so a GPU run is reproducible.
#ifndef GPIPE_SERVICES_TENSOR_CUDA_KERNELS_H_
#define GPIPE_SERVICES_TENSOR_CUDA_KERNELS_H_

#include <cstdint>

#include "services/tensor/cpu/softmax.h"

namespace gpipe::cuda {

// cuBLAS (blas.cc), row-major like cpu::Gemm; fp32 math (no TF32).
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c);
// The same product with bf16 operands (raw bf16 bits, from ToBf16), fp32
// accumulation and an fp32 C: tensor cores on sm_80 and later.
void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
              float alpha, const uint16_t* a, const uint16_t* b, float beta,
              float* c);
// y = x rounded to bf16 (to nearest, ties to even), as raw bits.
void ToBf16(int64_t n, const float* x, uint16_t* y);
// `batch` products, the i-th on a + i*stride_a, b + i*stride_b, c +
// i*stride_c (attention heads).
void GemmStridedBatched(bool trans_a, bool trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, const float* a,
                        int64_t stride_a, const float* b, int64_t stride_b,
                        float beta, float* c, int64_t stride_c, int64_t batch);

void Add(int64_t n, const float* a, const float* b, float* out);
void AddInPlace(int64_t n, const float* x, float* y);
void Axpy(int64_t n, float alpha, const float* x, float* y);
void Scale(int64_t n, float alpha, float* x);
void AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y);
// y[b, i] += x[i] for each of `batch` blocks of `inner` (positions).
void AddBroadcastInPlace(int64_t batch, int64_t inner, const float* x,
                         float* y);
// out[i] += sum over b of y[b, i], b in order.
void SumBlocksInto(int64_t batch, int64_t inner, const float* y, float* out);

void ReluForward(int64_t n, const float* x, float* y);
void ReluBackward(int64_t n, const float* y, const float* dy, float* dx);
void GeluForward(int64_t n, const float* x, float* y);
void GeluBackward(int64_t n, const float* x, const float* dy, float* dx);
void TanhForward(int64_t n, const float* x, float* y);
void TanhBackward(int64_t n, const float* y, const float* dy, float* dx);
// The CPU's masks: element i kept when UniformAt(key, i) >= p.
void DropoutForward(int64_t n, float p, uint64_t key, const float* x, float* y);

void SumRowsInto(int64_t rows, int64_t cols, const float* x, float* out);
// Sum of squares in double: fixed-size partial sums, then one block folds
// them in order. Synchronizes (the result comes back to the host).
// `scratch` holds kSumSquaresScratch doubles on the device.
constexpr int64_t kSumSquaresScratch = 256;
double SumSquares(int64_t n, const float* x, double* scratch);

// As cpu::SoftmaxCrossEntropy; `targets` on the device; `row_loss` and
// `row_correct` hold `rows` entries of device scratch. Synchronizes.
cpu::CrossEntropyResult SoftmaxCrossEntropy(
    int64_t rows, int64_t classes, const float* logits, const int32_t* targets,
    double normalizer, float* dlogits, double* row_loss, int32_t* row_correct);

void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                      const float* gamma, const float* beta, float* y,
                      float* mean, float* rstd);
void LayerNormBackward(int64_t rows, int64_t cols, const float* x,
                       const float* mean, const float* rstd, const float* gamma,
                       const float* dy, float* dx, float* dgamma, float* dbeta);

// ids are clamped into [0, vocab) on the way, as the CPU layer does.
void EmbeddingGather(int64_t n, int64_t dim, int64_t vocab, const int32_t* ids,
                     const float* table, float* out, int32_t* clamped_ids);
void EmbeddingScatterAdd(int64_t n, int64_t dim, const int32_t* ids,
                         const float* dout, float* dtable);

// Self-attention: attention.h.

// Optimizer updates, element by element as in services/nn/optimizer.cc.
void SgdStep(int64_t n, float lr, float decay, float mu, bool nesterov,
             bool first, const float* g, float* w, float* buf);
void AdamWStep(int64_t n, float decay, float beta1, float beta2,
               float step_size, float c2_sqrt, float eps, const float* g,
               float* w, float* m, float* v);

}  // namespace gpipe::cuda

#endif  // GPIPE_SERVICES_TENSOR_CUDA_KERNELS_H_
