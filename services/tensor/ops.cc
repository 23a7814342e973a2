#include "services/tensor/ops.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "services/tensor/cpu/attention.h"
#include "services/tensor/cpu/batch_norm.h"
#include "services/tensor/cpu/elementwise.h"
#include "services/tensor/cpu/embedding.h"
#include "services/tensor/cpu/gemm.h"
#include "services/tensor/cpu/layer_norm.h"
#include "services/tensor/cpu/optimizer.h"
#include "services/tensor/cpu/pool.h"
#include "services/tensor/cpu/reduce.h"
#include "services/tensor/fake_device.h"
#include "services/tensor/tensor.h"

// GPIPE_ON_CUDA runs the CUDA kernel for device tensors and returns; it
// falls through to the CPU kernel for host tensors and on the fake device
// (fake_device.h), whose memory `fake_access` opens for the rest of the
// function. Without the backend, real device tensors cannot exist (no
// allocator makes them).
#if GPIPE_HAVE_CUDA
#include "services/tensor/cuda/attention.h"
#include "services/tensor/cuda/cnn_kernels.h"
#include "services/tensor/cuda/kernels.h"
#define GPIPE_ON_CUDA(d, call)                              \
  const FakeDeviceAccess fake_access((d) == Device::kCuda); \
  if ((d) == Device::kCuda && !fake_access.active()) return cuda::call
#else
#define GPIPE_ON_CUDA(d, call)                              \
  const FakeDeviceAccess fake_access((d) == Device::kCuda); \
  if ((d) == Device::kCuda && !fake_access.active()) NoCuda(#call)
#endif
// True for real GPU tensors: the CUDA branch of a function that opened
// `fake_access` itself.
#define GPIPE_REAL_CUDA(d) ((d) == Device::kCuda && !fake_access.active())

namespace gpipe::ops {
namespace {
[[maybe_unused]] [[noreturn]] void NoCuda(const char* what) {
  std::fprintf(stderr, "%s: CUDA tensor without the CUDA backend\n", what);
  std::abort();
}
}  // namespace

namespace {
// -1: no scope on this thread (the process default applies).
thread_local int scoped_precision = -1;

GemmPrecision DefaultGemmPrecision() {
  static const GemmPrecision p = [] {
    const char* env = std::getenv("GPIPE_BF16");
    return env != nullptr && std::string(env) == "1" ? GemmPrecision::kBf16
                                                     : GemmPrecision::kF32;
  }();
  return p;
}
}  // namespace

GemmPrecision CurrentGemmPrecision() {
  return scoped_precision < 0 ? DefaultGemmPrecision()
                              : static_cast<GemmPrecision>(scoped_precision);
}
GemmPrecisionScope::GemmPrecisionScope(GemmPrecision p)
    : previous_(scoped_precision) {
  scoped_precision = static_cast<int>(p);
}
GemmPrecisionScope::~GemmPrecisionScope() { scoped_precision = previous_; }

void Gemm(Device d, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c) {
#if GPIPE_HAVE_CUDA
  if (d == Device::kCuda && !FakeDeviceEnabled() &&
      CurrentGemmPrecision() == GemmPrecision::kBf16 && m > 0 && n > 0 &&
      k > 0) {
    // Both operands as bf16 in one scratch buffer (2 bytes each, so half
    // as many floats; B starts 16-byte aligned, as tensor cores like), from
    // the thread's cached device allocator.
    const int64_t a_len = (m * k + 7) / 8 * 8;
    Tensor scratch = Tensor::Empty({(a_len + k * n + 1) / 2 + 1}, DType::kF32,
                                   Device::kCuda);
    uint16_t* a16 = static_cast<uint16_t*>(scratch.raw());
    uint16_t* b16 = a16 + a_len;
    cuda::ToBf16(m * k, a, a16);
    cuda::ToBf16(k * n, b, b16);
    cuda::GemmBf16(trans_a, trans_b, m, n, k, alpha, a16, b16, beta, c);
    return;
  }
#endif
  GPIPE_ON_CUDA(d, Gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c));
  cpu::Gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}
void Add(Device d, int64_t n, const float* a, const float* b, float* out) {
  GPIPE_ON_CUDA(d, Add(n, a, b, out));
  cpu::Add(n, a, b, out);
}
void AddInPlace(Device d, int64_t n, const float* x, float* y) {
  GPIPE_ON_CUDA(d, AddInPlace(n, x, y));
  cpu::AddInPlace(n, x, y);
}
void Scale(Device d, int64_t n, float alpha, float* x) {
  GPIPE_ON_CUDA(d, Scale(n, alpha, x));
  cpu::Scale(n, alpha, x);
}
void AddRowBias(Device d, int64_t rows, int64_t cols, const float* bias,
                float* y) {
  GPIPE_ON_CUDA(d, AddRowBias(rows, cols, bias, y));
  cpu::AddRowBias(rows, cols, bias, y);
}
void SumRowsInto(Device d, int64_t rows, int64_t cols, const float* x,
                 float* out) {
  GPIPE_ON_CUDA(d, SumRowsInto(rows, cols, x, out));
  cpu::SumRowsInto(rows, cols, x, out);
}
double SumSquares(Device d, int64_t n, const float* x) {
  const FakeDeviceAccess fake_access(d == Device::kCuda);
#if GPIPE_HAVE_CUDA
  if (GPIPE_REAL_CUDA(d)) {
    // Scratch from the thread's device allocator: cached, so no cudaMalloc
    // (which would synchronize the device) per call.
    Tensor scratch = Tensor::Empty({cuda::kSumSquaresScratch * 2}, DType::kF32,
                                   Device::kCuda);
    return cuda::SumSquares(n, x, static_cast<double*>(scratch.raw()));
  }
#else
  if (GPIPE_REAL_CUDA(d)) NoCuda("SumSquares");
#endif
  return cpu::SumSquares(n, x);
}
void ReluForward(Device d, int64_t n, const float* x, float* y) {
  GPIPE_ON_CUDA(d, ReluForward(n, x, y));
  cpu::ReluForward(n, x, y);
}
void ReluBackward(Device d, int64_t n, const float* y, const float* dy,
                  float* dx) {
  GPIPE_ON_CUDA(d, ReluBackward(n, y, dy, dx));
  cpu::ReluBackward(n, y, dy, dx);
}
void GeluForward(Device d, int64_t n, const float* x, float* y) {
  GPIPE_ON_CUDA(d, GeluForward(n, x, y));
  cpu::GeluForward(n, x, y);
}
void GeluBackward(Device d, int64_t n, const float* x, const float* dy,
                  float* dx) {
  GPIPE_ON_CUDA(d, GeluBackward(n, x, dy, dx));
  cpu::GeluBackward(n, x, dy, dx);
}
void TanhForward(Device d, int64_t n, const float* x, float* y) {
  GPIPE_ON_CUDA(d, TanhForward(n, x, y));
  cpu::TanhForward(n, x, y);
}
void TanhBackward(Device d, int64_t n, const float* y, const float* dy,
                  float* dx) {
  GPIPE_ON_CUDA(d, TanhBackward(n, y, dy, dx));
  cpu::TanhBackward(n, y, dy, dx);
}
void DropoutForward(Device d, int64_t n, float p, uint64_t key, const float* x,
                    float* y) {
  GPIPE_ON_CUDA(d, DropoutForward(n, p, key, x, y));
  cpu::DropoutForward(n, p, key, x, y);
}
void DropoutBackward(Device d, int64_t n, float p, uint64_t key,
                     const float* dy, float* dx) {
  // The same mask and scale applied to the gradient.
  GPIPE_ON_CUDA(d, DropoutForward(n, p, key, dy, dx));
  cpu::DropoutBackward(n, p, key, dy, dx);
}
cpu::CrossEntropyResult SoftmaxCrossEntropy(Device d, int64_t rows,
                                            int64_t classes,
                                            const float* logits,
                                            const int32_t* targets,
                                            double normalizer, float* dlogits) {
  const FakeDeviceAccess fake_access(d == Device::kCuda);
#if GPIPE_HAVE_CUDA
  if (GPIPE_REAL_CUDA(d)) {
    Tensor loss = Tensor::Empty({rows * 2}, DType::kF32, Device::kCuda);
    Tensor correct = Tensor::Empty({rows}, DType::kI32, Device::kCuda);
    return cuda::SoftmaxCrossEntropy(rows, classes, logits, targets, normalizer,
                                     dlogits, static_cast<double*>(loss.raw()),
                                     correct.i32());
  }
#else
  if (GPIPE_REAL_CUDA(d)) NoCuda("SoftmaxCrossEntropy");
#endif
  return cpu::SoftmaxCrossEntropy(rows, classes, logits, targets, normalizer,
                                  dlogits);
}
void LayerNormForward(Device d, int64_t rows, int64_t cols, float eps,
                      const float* x, const float* gamma, const float* beta,
                      float* y, float* mean, float* rstd) {
  GPIPE_ON_CUDA(
      d, LayerNormForward(rows, cols, eps, x, gamma, beta, y, mean, rstd));
  cpu::LayerNormForward(rows, cols, eps, x, gamma, beta, y, mean, rstd);
}
void LayerNormBackward(Device d, int64_t rows, int64_t cols, const float* x,
                       const float* mean, const float* rstd, const float* gamma,
                       const float* dy, float* dx, float* dgamma,
                       float* dbeta) {
  GPIPE_ON_CUDA(d, LayerNormBackward(rows, cols, x, mean, rstd, gamma, dy, dx,
                                     dgamma, dbeta));
  cpu::LayerNormBackward(rows, cols, x, mean, rstd, gamma, dy, dx, dgamma,
                         dbeta);
}

void MaxPool2dForward(Device d, int64_t planes, int64_t h, int64_t w,
                      int64_t kernel, int64_t stride, const float* x, float* y,
                      int32_t* argmax) {
  GPIPE_ON_CUDA(d,
                MaxPool2dForward(planes, h, w, kernel, stride, x, y, argmax));
  cpu::MaxPool2dForward(planes, h, w, kernel, stride, x, y, argmax);
}
void MaxPool2dBackward(Device d, int64_t planes, int64_t h, int64_t w,
                       int64_t kernel, int64_t stride, const float* dy,
                       const int32_t* argmax, float* dx) {
  GPIPE_ON_CUDA(
      d, MaxPool2dBackward(planes, h, w, kernel, stride, dy, argmax, dx));
  cpu::MaxPool2dBackward(planes, h, w, (h - kernel) / stride + 1,
                         (w - kernel) / stride + 1, dy, argmax, dx);
}
void GlobalAvgPoolForward(Device d, int64_t planes, int64_t inner,
                          const float* x, float* y) {
  GPIPE_ON_CUDA(d, GlobalAvgPoolForward(planes, inner, x, y));
  cpu::GlobalAvgPoolForward(planes, inner, x, y);
}
void GlobalAvgPoolBackward(Device d, int64_t planes, int64_t inner,
                           const float* dy, float* dx) {
  GPIPE_ON_CUDA(d, GlobalAvgPoolBackward(planes, inner, dy, dx));
  cpu::GlobalAvgPoolBackward(planes, inner, dy, dx);
}
void BatchNormForward(Device d, int64_t batch, int64_t channels, int64_t inner,
                      bool batch_stats, bool update_running, float momentum,
                      float eps, const float* x, const float* gamma,
                      const float* beta, float* running_mean,
                      float* running_var, float* y, float* mean, float* rstd,
                      float* statistics) {
  GPIPE_ON_CUDA(
      d, BatchNormForward(batch, channels, inner, batch_stats, update_running,
                          momentum, eps, x, gamma, beta, running_mean,
                          running_var, y, mean, rstd));
  cpu::BatchNormForward(batch, channels, inner, batch_stats, update_running,
                        momentum, eps, x, gamma, beta, running_mean,
                        running_var, y, mean, rstd, statistics);
}
void BatchNormMoveRunning(int64_t channels, float momentum,
                          const float* statistics, float* running_mean,
                          float* running_var) {
  cpu::BatchNormMoveRunning(channels, momentum, statistics, running_mean,
                            running_var);
}
void BatchNormBackward(Device d, int64_t batch, int64_t channels, int64_t inner,
                       const float* x, const float* mean, const float* rstd,
                       const float* gamma, const float* dy, float* dx,
                       float* dgamma, float* dbeta) {
  GPIPE_ON_CUDA(d, BatchNormBackward(batch, channels, inner, x, mean, rstd,
                                     gamma, dy, dx, dgamma, dbeta));
  cpu::BatchNormBackward(batch, channels, inner, x, mean, rstd, gamma, dy, dx,
                         dgamma, dbeta);
}

void GemmRowStable(Device d, int64_t m, int64_t n, int64_t k, const float* a,
                   const float* w, float* c) {
  const FakeDeviceAccess fake_access(d == Device::kCuda);
#if GPIPE_HAVE_CUDA
  if (GPIPE_REAL_CUDA(d)) {
    // One product per row, always of the same shape: a row's result cannot
    // depend on its neighbours (fp32, whatever GemmPrecision says).
    for (int64_t i = 0; i < m; ++i)
      cuda::Gemm(false, true, 1, n, k, 1.0f, a + i * k, w, 0.0f, c + i * n);
    return;
  }
#else
  if (GPIPE_REAL_CUDA(d)) NoCuda("GemmRowStable");
#endif
  cpu::GemmRowStable(m, n, k, a, w, c);
}

void AttendCachedRows(Device d, int64_t batch, int64_t heads, int64_t cap,
                      int64_t from, int64_t to, int64_t dim, float scale,
                      const float* qkv, float* out) {
  const FakeDeviceAccess fake_access(d == Device::kCuda);
#if GPIPE_HAVE_CUDA
  if (GPIPE_REAL_CUDA(d)) {
    Tensor scratch =
        Tensor::Empty({std::max<int64_t>(batch * heads * (to - from) * to, 1)},
                      DType::kF32, Device::kCuda);
    cuda::AttendCachedRows(batch, heads, cap, from, to, dim, scale, qkv, out,
                           scratch.f32());
    return;
  }
#else
  if (GPIPE_REAL_CUDA(d)) NoCuda("AttendCachedRows");
#endif
  cpu::AttendCachedRows(batch, heads, cap, from, to, dim, scale, qkv, out);
}

void SgdStep(Device d, int64_t n, float lr, float decay, float mu,
             bool nesterov, bool first, const float* g, float* w, float* buf) {
  GPIPE_ON_CUDA(d, SgdStep(n, lr, decay, mu, nesterov, first, g, w, buf));
  cpu::SgdStep(n, lr, decay, mu, nesterov, first, g, w, buf);
}
void AdamWStep(Device d, int64_t n, float decay, float beta1, float beta2,
               float step_size, float c2_sqrt, float eps, const float* g,
               float* w, float* m, float* v) {
  GPIPE_ON_CUDA(d, AdamWStep(n, decay, beta1, beta2, step_size, c2_sqrt, eps, g,
                             w, m, v));
  cpu::AdamWStep(n, decay, beta1, beta2, step_size, c2_sqrt, eps, g, w, m, v);
}

void AttentionForward(Device d, int64_t batch, int64_t heads, int64_t t,
                      int64_t dim, bool causal, float scale, const float* qkv,
                      float* probs, float* out) {
  const FakeDeviceAccess fake_access(d == Device::kCuda);
#if GPIPE_HAVE_CUDA
  if (GPIPE_REAL_CUDA(d)) {
    Tensor scratch = Tensor::Empty(
        {std::max<int64_t>(cuda::AttentionForwardScratch(batch, heads, t, dim),
                           1)},
        DType::kF32, Device::kCuda);
    cuda::AttentionForward(batch, heads, t, dim, causal, scale, qkv, probs, out,
                           scratch.f32());
    return;
  }
#else
  if (GPIPE_REAL_CUDA(d)) NoCuda("AttentionForward");
#endif
  cpu::AttentionForward(batch, heads, t, dim, causal, scale, qkv, probs, out);
}
void AttentionBackward(Device d, int64_t batch, int64_t heads, int64_t t,
                       int64_t dim, bool causal, float scale, const float* qkv,
                       const float* probs, const float* dout, float* dqkv) {
  const FakeDeviceAccess fake_access(d == Device::kCuda);
#if GPIPE_HAVE_CUDA
  if (GPIPE_REAL_CUDA(d)) {
    Tensor scratch = Tensor::Empty(
        {std::max<int64_t>(cuda::AttentionBackwardScratch(batch, heads, t, dim),
                           1)},
        DType::kF32, Device::kCuda);
    cuda::AttentionBackward(batch, heads, t, dim, causal, scale, qkv, probs,
                            dout, dqkv, scratch.f32());
    return;
  }
#else
  if (GPIPE_REAL_CUDA(d)) NoCuda("AttentionBackward");
#endif
  cpu::AttentionBackward(batch, heads, t, dim, causal, scale, qkv, probs, dout,
                         dqkv);
}

void EmbeddingForward(Device d, int64_t batch, int64_t t, int64_t dim,
                      int64_t vocab, const int32_t* ids, const float* token,
                      const float* position, float* y, int32_t* clamped) {
  const int64_t n = batch * t;
  const FakeDeviceAccess fake_access(d == Device::kCuda);
#if GPIPE_HAVE_CUDA
  if (GPIPE_REAL_CUDA(d)) {
    cuda::EmbeddingGather(n, dim, vocab, ids, token, y, clamped);
    cuda::AddBroadcastInPlace(batch, t * dim, position, y);
    return;
  }
#else
  if (GPIPE_REAL_CUDA(d)) NoCuda("EmbeddingForward");
#endif
  for (int64_t i = 0; i < n; ++i)
    clamped[i] = std::clamp<int32_t>(ids[i], 0, vocab - 1);
  cpu::EmbeddingGather(n, dim, clamped, token, y);
  for (int64_t b = 0; b < batch; ++b)
    cpu::AddInPlace(t * dim, position, y + b * t * dim);
}

void EmbeddingBackward(Device d, int64_t batch, int64_t t, int64_t dim,
                       const int32_t* ids, const float* dy, float* dtoken,
                       float* dposition) {
  const FakeDeviceAccess fake_access(d == Device::kCuda);
#if GPIPE_HAVE_CUDA
  if (GPIPE_REAL_CUDA(d)) {
    cuda::EmbeddingScatterAdd(batch * t, dim, ids, dy, dtoken);
    cuda::SumBlocksInto(batch, t * dim, dy, dposition);
    return;
  }
#else
  if (GPIPE_REAL_CUDA(d)) NoCuda("EmbeddingBackward");
#endif
  cpu::EmbeddingScatterAdd(batch * t, dim, ids, dy, dtoken);
  for (int64_t b = 0; b < batch; ++b)
    cpu::AddInPlace(t * dim, dy + b * t * dim, dposition);
}

}  // namespace gpipe::ops
