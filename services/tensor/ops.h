// The kernel set chosen by device: each op runs the CPU kernel (cpu/) for
// Device::kCpu and the CUDA kernel (cuda/) for Device::kCuda, with the same
// arguments (pointers on that device). Layers call these with their
// tensors' device, so one layer body serves both backends; the CPU path
// calls exactly the kernels it called before.
#ifndef GPIPE_SERVICES_TENSOR_OPS_H_
#define GPIPE_SERVICES_TENSOR_OPS_H_

#include <cstdint>
#include <string>

#include "services/tensor/cpu/conv.h"
#include "services/tensor/cpu/softmax.h"
#include "services/tensor/dtype.h"

namespace gpipe::ops {

// GEMM precision on the GPU: fp32 (no TF32), or bf16 operands with fp32
// accumulation and an fp32 result. bf16 compute keeps fp32 master weights:
// parameters, gradients, activations and optimizer state stay fp32 and only
// a product's two operands are rounded to bf16 on the way in. The CPU
// always computes in fp32. A thread's precision is the innermost
// GemmPrecisionScope's, else the process default: bf16 when GPIPE_BF16=1.
enum class GemmPrecision { kF32, kBf16 };
GemmPrecision CurrentGemmPrecision();
class GemmPrecisionScope {
 public:
  explicit GemmPrecisionScope(GemmPrecision p);
  ~GemmPrecisionScope();
  GemmPrecisionScope(const GemmPrecisionScope&) = delete;
  GemmPrecisionScope& operator=(const GemmPrecisionScope&) = delete;

 private:
  int previous_;
};

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

// 2-D convolution, NCHW, weight [Cout, Cin, k, k] (conv_ops.cc): im2col and
// one GEMM per chunk of samples on either device, or cuDNN on the GPU.
// kAuto takes cuDNN when CudnnSelected(); kCudnn takes it whenever it is
// usable (tests compare the paths); both fall back to im2col otherwise.
enum class ConvPath { kAuto, kIm2Col, kCudnn };
// Whether cuDNN opens and runs here (whatever GPIPE_CUDNN says).
bool CudnnUsable();
// Whether kAuto convolutions on the GPU go through cuDNN: it opens and runs
// here, and GPIPE_CUDNN is not "0". Decided once per process.
bool CudnnSelected();
// Why (not): "cuDNN 9.19.0" or "GPIPE_CUDNN=0" or what failed to load.
std::string CudnnDescription();
// y = conv(x) (+ bias per channel when `bias` is not null).
void Conv2dForward(Device d, const cpu::ConvGeometry& g, int64_t batch,
                   int64_t out_channels, const float* x, const float* weight,
                   const float* bias, float* y,
                   ConvPath path = ConvPath::kAuto);
// dx (when not null: null skips the input gradient) is overwritten; dweight
// and dbias (when not null: null skips them) accumulate.
void Conv2dBackward(Device d, const cpu::ConvGeometry& g, int64_t batch,
                    int64_t out_channels, const float* x, const float* weight,
                    const float* dy, float* dx, float* dweight, float* dbias,
                    ConvPath path = ConvPath::kAuto);

// Pooling over [planes, h, w] (no padding); argmax saves each maximum's
// index within its plane. The backward overwrites dx.
void MaxPool2dForward(Device d, int64_t planes, int64_t h, int64_t w,
                      int64_t kernel, int64_t stride, const float* x, float* y,
                      int32_t* argmax);
void MaxPool2dBackward(Device d, int64_t planes, int64_t h, int64_t w,
                       int64_t kernel, int64_t stride, const float* dy,
                       const int32_t* argmax, float* dx);
void GlobalAvgPoolForward(Device d, int64_t planes, int64_t inner,
                          const float* x, float* y);
void GlobalAvgPoolBackward(Device d, int64_t planes, int64_t inner,
                           const float* dy, float* dx);

// Batch norm over [batch, channels, inner]; see cpu/batch_norm.h.
// `statistics` (the batch's, for a later BatchNormMoveRunning) is for the
// CPU: it must be null on a GPU.
void BatchNormForward(Device d, int64_t batch, int64_t channels, int64_t inner,
                      bool batch_stats, bool update_running, float momentum,
                      float eps, const float* x, const float* gamma,
                      const float* beta, float* running_mean,
                      float* running_var, float* y, float* mean, float* rstd,
                      float* statistics = nullptr);
// On host buffers.
void BatchNormMoveRunning(int64_t channels, float momentum,
                          const float* statistics, float* running_mean,
                          float* running_var);
void BatchNormBackward(Device d, int64_t batch, int64_t channels, int64_t inner,
                       const float* x, const float* mean, const float* rstd,
                       const float* gamma, const float* dy, float* dx,
                       float* dgamma, float* dbeta);

// C[m,n] = A[m,k] W[n,k]^T with every row of C a function of its row of A
// alone (cpu::GemmRowStable; on the GPU one cuBLAS call per row): what
// incremental decoding needs to agree with a whole-sequence pass.
void GemmRowStable(Device d, int64_t m, int64_t n, int64_t k, const float* a,
                   const float* w, float* c);
// Incremental decoding's attention; see cpu::AttendCachedRows.
void AttendCachedRows(Device d, int64_t batch, int64_t heads, int64_t cap,
                      int64_t from, int64_t to, int64_t dim, float scale,
                      const float* qkv, float* out);

// Optimizer updates; see cpu/optimizer.h (buf null: SGD without momentum).
void SgdStep(Device d, int64_t n, float lr, float decay, float mu,
             bool nesterov, bool first, const float* g, float* w, float* buf);
void AdamWStep(Device d, int64_t n, float decay, float beta1, float beta2,
               float step_size, float c2_sqrt, float eps, const float* g,
               float* w, float* m, float* v);

// Self-attention over fused [q | k | v] rows: cpu/attention.h on the CPU,
// cuBLAS strided-batched GEMMs on the GPU (cuda/attention.h). probs, out
// and dqkv are written whole.
void AttentionForward(Device d, int64_t batch, int64_t heads, int64_t t,
                      int64_t dim, bool causal, float scale, const float* qkv,
                      float* probs, float* out);
void AttentionBackward(Device d, int64_t batch, int64_t heads, int64_t t,
                       int64_t dim, bool causal, float scale, const float* qkv,
                       const float* probs, const float* dout, float* dqkv);

}  // namespace gpipe::ops

#endif  // GPIPE_SERVICES_TENSOR_OPS_H_
