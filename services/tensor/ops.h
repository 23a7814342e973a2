// The kernel set chosen by device: each op runs the CPU kernel (cpu/) for
// Device::kCpu and the CUDA kernel (cuda/) for Device::kCuda, with the same
// arguments (pointers on that device). Layers call these with their
// tensors' device, so one layer body serves both backends; the CPU path
// calls exactly the kernels it called before.
#ifndef GPIPE_SERVICES_TENSOR_OPS_H_
#define GPIPE_SERVICES_TENSOR_OPS_H_

#include <cstdint>

#include "services/tensor/cpu/softmax.h"
#include "services/tensor/dtype.h"

namespace gpipe::ops {

void Gemm(Device d, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c);
void Add(Device d, int64_t n, const float* a, const float* b, float* out);
void AddInPlace(Device d, int64_t n, const float* x, float* y);
void Scale(Device d, int64_t n, float alpha, float* x);
void AddRowBias(Device d, int64_t rows, int64_t cols, const float* bias,
                float* y);
void SumRowsInto(Device d, int64_t rows, int64_t cols, const float* x,
                 float* out);
double SumSquares(Device d, int64_t n, const float* x);

void ReluForward(Device d, int64_t n, const float* x, float* y);
void ReluBackward(Device d, int64_t n, const float* y, const float* dy,
                  float* dx);
void GeluForward(Device d, int64_t n, const float* x, float* y);
void GeluBackward(Device d, int64_t n, const float* x, const float* dy,
                  float* dx);
void TanhForward(Device d, int64_t n, const float* x, float* y);
void TanhBackward(Device d, int64_t n, const float* y, const float* dy,
                  float* dx);
void DropoutForward(Device d, int64_t n, float p, uint64_t key, const float* x,
                    float* y);
void DropoutBackward(Device d, int64_t n, float p, uint64_t key,
                     const float* dy, float* dx);

cpu::CrossEntropyResult SoftmaxCrossEntropy(Device d, int64_t rows,
                                            int64_t classes,
                                            const float* logits,
                                            const int32_t* targets,
                                            double normalizer, float* dlogits);
void LayerNormForward(Device d, int64_t rows, int64_t cols, float eps,
                      const float* x, const float* gamma, const float* beta,
                      float* y, float* mean, float* rstd);
void LayerNormBackward(Device d, int64_t rows, int64_t cols, const float* x,
                       const float* mean, const float* rstd, const float* gamma,
                       const float* dy, float* dx, float* dgamma, float* dbeta);

// Token plus position embedding of [batch, t] ids (clamped into the
// vocabulary; the clamped ids are written to `clamped` for backward).
void EmbeddingForward(Device d, int64_t batch, int64_t t, int64_t dim,
                      int64_t vocab, const int32_t* ids, const float* token,
                      const float* position, float* y, int32_t* clamped);
// Accumulates the token and position gradients, tokens in order.
void EmbeddingBackward(Device d, int64_t batch, int64_t t, int64_t dim,
                       const int32_t* ids, const float* dy, float* dtoken,
                       float* dposition);

// Optimizer updates on the GPU (the CPU loops stay in services/nn).
void CudaSgdStep(int64_t n, float lr, float decay, float mu, bool nesterov,
                 bool first, const float* g, float* w, float* buf);
void CudaAdamWStep(int64_t n, float decay, float beta1, float beta2,
                   float step_size, float c2_sqrt, float eps, const float* g,
                   float* w, float* m, float* v);

// Self-attention on the GPU (the CPU loops stay in the layer, where the
// bitwise contract was written); see cuda/kernels.h. Device pointers only.
void CudaAttentionForward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                          bool causal, float scale, const float* qkv,
                          float* probs, float* out);
void CudaAttentionBackward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                           bool causal, float scale, const float* qkv,
                           const float* probs, const float* dout, float* dqkv,
                           float* scratch);

}  // namespace gpipe::ops

#endif  // GPIPE_SERVICES_TENSOR_OPS_H_
