// All own CUDA kernels in one translation unit: nvcc time is what CI pays,
// and none of these needs templates beyond a grid-stride loop.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <vector>

#include "services/core/rng.h"
#include "services/tensor/cuda/kernels.h"
#include "services/tensor/cuda/launch.cuh"
#include "services/tensor/cuda/runtime.h"

namespace gpipe::cuda {
namespace {

__global__ void AddKernel(int64_t n, const float* a, const float* b,
                          float* out) {
  GPIPE_FOR_EACH(i, n) out[i] = a[i] + b[i];
}
__global__ void ToBf16Kernel(int64_t n, const float* x, uint16_t* y) {
  GPIPE_FOR_EACH(i, n) {
    y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
}
__global__ void AxpyKernel(int64_t n, float alpha, const float* x, float* y) {
  GPIPE_FOR_EACH(i, n) y[i] += alpha * x[i];
}
__global__ void AddInPlaceKernel(int64_t n, const float* x, float* y) {
  GPIPE_FOR_EACH(i, n) y[i] += x[i];
}
__global__ void ScaleKernel(int64_t n, float alpha, float* x) {
  GPIPE_FOR_EACH(i, n) x[i] *= alpha;
}
__global__ void AddRowBiasKernel(int64_t rows, int64_t cols, const float* bias,
                                 float* y) {
  GPIPE_FOR_EACH(i, rows * cols) y[i] += bias[i % cols];
}
__global__ void AddBroadcastKernel(int64_t batch, int64_t inner, const float* x,
                                   float* y) {
  GPIPE_FOR_EACH(i, batch * inner) y[i] += x[i % inner];
}
// s + x[0] + x[stride] + ... + x[(n - 1) * stride], added in that order
// (the CPU's), with the loads issued 16 ahead of the adds: a thread that
// walks a column is bound by memory latency, not by its adds.
__device__ float SumStrided(float s, const float* x, int64_t n,
                            int64_t stride) {
  constexpr int kAhead = 16;
  int64_t r = 0;
  for (; r + kAhead <= n; r += kAhead) {
    float v[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) v[u] = x[(r + u) * stride];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) s += v[u];
  }
  for (; r < n; ++r) s += x[r * stride];
  return s;
}
// One thread per column walks the rows in order: the CPU's summation order.
__global__ void SumRowsKernel(int64_t rows, int64_t cols, const float* x,
                              float* out) {
  GPIPE_FOR_EACH(c, cols) out[c] = SumStrided(out[c], x + c, rows, cols);
}
__global__ void ReluForwardKernel(int64_t n, const float* x, float* y) {
  GPIPE_FOR_EACH(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
__global__ void ReluBackwardKernel(int64_t n, const float* y, const float* dy,
                                   float* dx) {
  GPIPE_FOR_EACH(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
__global__ void GeluForwardKernel(int64_t n, const float* x, float* y) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  GPIPE_FOR_EACH(i, n) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * kInvSqrt2));
}
__global__ void GeluBackwardKernel(int64_t n, const float* x, const float* dy,
                                   float* dx) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  constexpr float kInvSqrt2Pi = 0.39894228040143268f;
  GPIPE_FOR_EACH(i, n) {
    const float cdf = 0.5f * (1.0f + erff(x[i] * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * expf(-0.5f * x[i] * x[i]);
    dx[i] = dy[i] * (cdf + x[i] * pdf);
  }
}
__global__ void TanhForwardKernel(int64_t n, const float* x, float* y) {
  GPIPE_FOR_EACH(i, n) y[i] = tanhf(x[i]);
}
__global__ void TanhBackwardKernel(int64_t n, const float* y, const float* dy,
                                   float* dx) {
  GPIPE_FOR_EACH(i, n) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}
__global__ void DropoutKernel(int64_t n, float p, float scale, uint64_t key,
                              const float* x, float* y) {
  GPIPE_FOR_EACH(i, n) {
    y[i] = UniformAt(key, static_cast<uint64_t>(i)) >= p ? x[i] * scale : 0.0f;
  }
}

// Partial sums of squares: block b folds a fixed slice pattern in a fixed
// tree, so the result depends only on n.
constexpr int kSumBlocks = static_cast<int>(kSumSquaresScratch);
__global__ void SumSquaresPartial(int64_t n, const float* x, double* partial) {
  __shared__ double acc[kThreads];
  double s = 0.0;
  GPIPE_FOR_EACH(i, n) s += static_cast<double>(x[i]) * x[i];
  acc[threadIdx.x] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) acc[threadIdx.x] += acc[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = acc[0];
}
__global__ void SumPartials(int n, double* partial) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s = 0.0;
  for (int i = 0; i < n; ++i) s += partial[i];
  partial[0] = s;
}

// The row's largest logit and its first column, as the CPU's strict `>`
// scan finds it: each lane scans its columns in order, then the butterfly
// keeps the larger value and, on a tie, the smaller column, which is an
// order-free choice, so every lane ends with the same pair.
__device__ void WarpArgMax(float& m, int64_t& arg) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o);
    const int64_t oa = __shfl_xor_sync(0xffffffffu, arg, o);
    if (om > m || (om == m && oa < arg)) m = om, arg = oa;
  }
}
// Cross-entropy: a warp per row (launched with kWarp threads a row), as
// layer norm below. One thread per row left most of the GPU idle, read 32
// rows' columns apart, and walked a vocabulary-wide row alone. The maximum
// is exact in any order; the sum is WarpSum's fixed tree, reproducible but
// not the CPU's order (within its rounding: cuda_kernels_test).
__global__ void CrossEntropyKernel(int64_t rows, int64_t classes,
                                   const float* logits, const int32_t* targets,
                                   float scale, float* dlogits,
                                   double* row_loss, int32_t* row_correct) {
  const int lane = threadIdx.x % kWarp;
  GPIPE_FOR_EACH_ROW(r, rows) {
    const float* z = logits + r * classes;
    const int32_t t = targets[r];
    // Lanes with no column (classes < 32) hold -inf at an index past the
    // row, which never wins against a real column.
    float m = -INFINITY;
    int64_t arg = classes;
    for (int64_t c = lane; c < classes; c += kWarp)
      if (z[c] > m || arg == classes) m = z[c], arg = c;
    WarpArgMax(m, arg);
    float s = 0.0f;
    for (int64_t c = lane; c < classes; c += kWarp) s += expf(z[c] - m);
    s = WarpSum(s);
    // A target outside [0, classes) is never read through: -2 marks it
    // for the host to refuse (-1 is an ignored row).
    const bool valid = t >= 0 && t < classes;
    if (lane == 0) {
      row_loss[r] = valid ? static_cast<double>(logf(s) - (z[t] - m)) : 0.0;
      row_correct[r] = valid ? (arg == t ? 1 : 0) : (t == -1 ? -1 : -2);
    }
    if (dlogits != nullptr) {
      float* d = dlogits + r * classes;
      const float inv = 1.0f / s;
      for (int64_t c = lane; c < classes; c += kWarp) {
        const float g = expf(z[c] - m) * inv * scale;
        d[c] = !valid ? 0.0f : (c == t ? g - scale : g);
      }
    }
  }
}
// Layer norm: a warp per row (a thread per row left most of the GPU idle
// and read 32 rows' columns apart). Each lane sums its columns in order,
// then WarpSum: a fixed order, so runs are reproducible, though not the
// CPU's order (within its rounding: cuda_kernels_test).
__global__ void LayerNormForwardKernel(int64_t rows, int64_t cols, float eps,
                                       const float* x, const float* gamma,
                                       const float* beta, float* y, float* mean,
                                       float* rstd) {
  const int lane = threadIdx.x % kWarp;
  GPIPE_FOR_EACH_ROW(r, rows) {
    const float* in = x + r * cols;
    float* out = y + r * cols;
    float m = 0.0f;
    for (int64_t c = lane; c < cols; c += kWarp) m += in[c];
    m = WarpSum(m) / static_cast<float>(cols);
    float v = 0.0f;
    for (int64_t c = lane; c < cols; c += kWarp) v += (in[c] - m) * (in[c] - m);
    v = WarpSum(v) / static_cast<float>(cols);
    const float s = 1.0f / sqrtf(v + eps);
    for (int64_t c = lane; c < cols; c += kWarp)
      out[c] = (in[c] - m) * s * gamma[c] + beta[c];
    if (lane == 0) {
      mean[r] = m;
      rstd[r] = s;
    }
  }
}
__global__ void LayerNormBackwardRows(int64_t rows, int64_t cols,
                                      const float* x, const float* mean,
                                      const float* rstd, const float* gamma,
                                      const float* dy, float* dx) {
  const int lane = threadIdx.x % kWarp;
  GPIPE_FOR_EACH_ROW(r, rows) {
    const float* in = x + r * cols;
    const float* g = dy + r * cols;
    float* out = dx + r * cols;
    const float m = mean[r], s = rstd[r];
    float sum_d = 0.0f, sum_dx = 0.0f;
    for (int64_t c = lane; c < cols; c += kWarp) {
      const float xhat = (in[c] - m) * s;
      const float d = g[c] * gamma[c];
      sum_d += d;
      sum_dx += d * xhat;
    }
    sum_d = WarpSum(sum_d) / static_cast<float>(cols);
    sum_dx = WarpSum(sum_dx) / static_cast<float>(cols);
    for (int64_t c = lane; c < cols; c += kWarp) {
      const float xhat = (in[c] - m) * s;
      out[c] = s * (g[c] * gamma[c] - sum_d - xhat * sum_dx);
    }
  }
}
// Parameter gradients: one thread per column, rows in order (dbeta is the
// CPU's bits), loads issued 8 rows ahead as in SumStrided.
__global__ void LayerNormBackwardParams(int64_t rows, int64_t cols,
                                        const float* x, const float* mean,
                                        const float* rstd, const float* dy,
                                        float* dgamma, float* dbeta) {
  constexpr int kAhead = 8;
  GPIPE_FOR_EACH(c, cols) {
    float dg = dgamma[c], db = dbeta[c];
    int64_t r = 0;
    for (; r + kAhead <= rows; r += kAhead) {
      float g[kAhead], xs[kAhead], ms[kAhead], ss[kAhead];
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        g[u] = dy[(r + u) * cols + c];
        xs[u] = x[(r + u) * cols + c];
        ms[u] = mean[r + u];
        ss[u] = rstd[r + u];
      }
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
        dg += g[u] * (xs[u] - ms[u]) * ss[u];
        db += g[u];
      }
    }
    for (; r < rows; ++r) {
      const float g = dy[r * cols + c];
      dg += g * (x[r * cols + c] - mean[r]) * rstd[r];
      db += g;
    }
    dgamma[c] = dg;
    dbeta[c] = db;
  }
}
__global__ void EmbeddingGatherKernel(int64_t n, int64_t dim, int64_t vocab,
                                      const int32_t* ids, const float* table,
                                      float* out, int32_t* clamped) {
  GPIPE_FOR_EACH(i, n * dim) {
    const int64_t row = i / dim;
    int32_t id = ids[row];
    id = id < 0 ? 0 : (id >= vocab ? static_cast<int32_t>(vocab - 1) : id);
    if (i % dim == 0) clamped[row] = id;
    out[i] = table[static_cast<int64_t>(id) * dim + i % dim];
  }
}
// Thread (d, b) adds, tokens in order, column d of every token whose id
// falls in bucket b (id % kScatterBuckets): each table entry still gets
// its tokens' values in the CPU's order and from one thread, so no atomics
// and the CPU's bits, with kScatterBuckets times the threads of one per
// column (a 256-wide table gave 256 threads, each walking every token).
constexpr int64_t kScatterBuckets = 32;
__global__ void EmbeddingScatterKernel(int64_t n, int64_t dim,
                                       const int32_t* ids, const float* dout,
                                       float* dtable) {
  GPIPE_FOR_EACH(e, dim * kScatterBuckets) {
    const int64_t d = e % dim, b = e / dim;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids[i];
      if (id % kScatterBuckets == b) dtable[id * dim + d] += dout[i * dim + d];
    }
  }
}
__global__ void SumBlocksKernel(int64_t batch, int64_t inner, const float* y,
                                float* out) {
  GPIPE_FOR_EACH(i, inner) out[i] = SumStrided(out[i], y + i, batch, inner);
}
__global__ void SgdKernel(int64_t n, float lr, float decay, float mu,
                          bool nesterov, bool first, const float* g, float* w,
                          float* buf) {
  GPIPE_FOR_EACH(j, n) {
    if (mu == 0.0f) {
      w[j] -= lr * (g[j] + decay * w[j]);
    } else {
      const float d = g[j] + decay * w[j];
      buf[j] = first ? d : mu * buf[j] + d;
      w[j] -= lr * (nesterov ? d + mu * buf[j] : buf[j]);
    }
  }
}
__global__ void AdamWKernel(int64_t n, float decay, float beta1, float beta2,
                            float step_size, float c2_sqrt, float eps,
                            const float* g, float* w, float* m, float* v) {
  GPIPE_FOR_EACH(j, n) {
    w[j] *= decay;
    m[j] = beta1 * m[j] + (1.0f - beta1) * g[j];
    v[j] = beta2 * v[j] + (1.0f - beta2) * g[j] * g[j];
    w[j] -= step_size * m[j] / (sqrtf(v[j]) / c2_sqrt + eps);
  }
}

}  // namespace

void Add(int64_t n, const float* a, const float* b, float* out) {
  GPIPE_LAUNCH(AddKernel, n, n, a, b, out);
}
void AddInPlace(int64_t n, const float* x, float* y) {
  GPIPE_LAUNCH(AddInPlaceKernel, n, n, x, y);
}
void ToBf16(int64_t n, const float* x, uint16_t* y) {
  GPIPE_LAUNCH(ToBf16Kernel, n, n, x, y);
}
void Axpy(int64_t n, float alpha, const float* x, float* y) {
  GPIPE_LAUNCH(AxpyKernel, n, n, alpha, x, y);
}
void Scale(int64_t n, float alpha, float* x) {
  GPIPE_LAUNCH(ScaleKernel, n, n, alpha, x);
}
void AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y) {
  GPIPE_LAUNCH(AddRowBiasKernel, rows * cols, rows, cols, bias, y);
}
void AddBroadcastInPlace(int64_t batch, int64_t inner, const float* x,
                         float* y) {
  GPIPE_LAUNCH(AddBroadcastKernel, batch * inner, batch, inner, x, y);
}
void SumBlocksInto(int64_t batch, int64_t inner, const float* y, float* out) {
  GPIPE_LAUNCH(SumBlocksKernel, inner, batch, inner, y, out);
}
void ReluForward(int64_t n, const float* x, float* y) {
  GPIPE_LAUNCH(ReluForwardKernel, n, n, x, y);
}
void ReluBackward(int64_t n, const float* y, const float* dy, float* dx) {
  GPIPE_LAUNCH(ReluBackwardKernel, n, n, y, dy, dx);
}
void GeluForward(int64_t n, const float* x, float* y) {
  GPIPE_LAUNCH(GeluForwardKernel, n, n, x, y);
}
void GeluBackward(int64_t n, const float* x, const float* dy, float* dx) {
  GPIPE_LAUNCH(GeluBackwardKernel, n, n, x, dy, dx);
}
void TanhForward(int64_t n, const float* x, float* y) {
  GPIPE_LAUNCH(TanhForwardKernel, n, n, x, y);
}
void TanhBackward(int64_t n, const float* y, const float* dy, float* dx) {
  GPIPE_LAUNCH(TanhBackwardKernel, n, n, y, dy, dx);
}
void DropoutForward(int64_t n, float p, uint64_t key, const float* x,
                    float* y) {
  const float scale = 1.0f / (1.0f - p);
  GPIPE_LAUNCH(DropoutKernel, n, n, p, scale, key, x, y);
}
void SumRowsInto(int64_t rows, int64_t cols, const float* x, float* out) {
  GPIPE_LAUNCH(SumRowsKernel, cols, rows, cols, x, out);
}

double SumSquares(int64_t n, const float* x, double* partial) {
  if (n == 0) return 0.0;
  SumSquaresPartial<<<kSumBlocks, kThreads, 0, Current()>>>(n, x, partial);
  CheckLastError("SumSquaresPartial");
  SumPartials<<<1, 1, 0, Current()>>>(kSumBlocks, partial);
  CheckLastError("SumPartials");
  double s = 0.0;
  CopyDeviceToHost(&s, partial, sizeof(double));
  return s;
}

cpu::CrossEntropyResult SoftmaxCrossEntropy(int64_t rows, int64_t classes,
                                            const float* logits,
                                            const int32_t* targets,
                                            double normalizer, float* dlogits,
                                            double* loss, int32_t* correct) {
  cpu::CrossEntropyResult result;
  if (rows == 0) return result;
  const float scale = static_cast<float>(1.0 / normalizer);
  GPIPE_LAUNCH(CrossEntropyKernel, rows * kWarp, rows, classes, logits, targets,
               scale, dlogits, loss, correct);
  std::vector<double> row_loss(rows);
  std::vector<int32_t> row_correct(rows);
  CopyDeviceToHost(row_loss.data(), loss, rows * sizeof(double));
  CopyDeviceToHost(row_correct.data(), correct, rows * sizeof(int32_t));
  // Folded on the host in row order, as the CPU does.
  for (int64_t r = 0; r < rows; ++r) {
    if (row_correct[r] == -2) ++result.out_of_range;
    if (row_correct[r] < 0) continue;
    result.loss_sum += row_loss[r];
    result.counted += 1;
    result.correct += row_correct[r];
  }
  return result;
}

void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x,
                      const float* gamma, const float* beta, float* y,
                      float* mean, float* rstd) {
  GPIPE_LAUNCH(LayerNormForwardKernel, rows * kWarp, rows, cols, eps, x, gamma,
               beta, y, mean, rstd);
}
void LayerNormBackward(int64_t rows, int64_t cols, const float* x,
                       const float* mean, const float* rstd, const float* gamma,
                       const float* dy, float* dx, float* dgamma,
                       float* dbeta) {
  GPIPE_LAUNCH(LayerNormBackwardRows, rows * kWarp, rows, cols, x, mean, rstd,
               gamma, dy, dx);
  GPIPE_LAUNCH(LayerNormBackwardParams, cols, rows, cols, x, mean, rstd, dy,
               dgamma, dbeta);
}

void EmbeddingGather(int64_t n, int64_t dim, int64_t vocab, const int32_t* ids,
                     const float* table, float* out, int32_t* clamped_ids) {
  GPIPE_LAUNCH(EmbeddingGatherKernel, n * dim, n, dim, vocab, ids, table, out,
               clamped_ids);
}
void EmbeddingScatterAdd(int64_t n, int64_t dim, const int32_t* ids,
                         const float* dout, float* dtable) {
  GPIPE_LAUNCH(EmbeddingScatterKernel, dim * kScatterBuckets, n, dim, ids, dout,
               dtable);
}

void SgdStep(int64_t n, float lr, float decay, float mu, bool nesterov,
             bool first, const float* g, float* w, float* buf) {
  GPIPE_LAUNCH(SgdKernel, n, n, lr, decay, mu, nesterov, first, g, w, buf);
}
void AdamWStep(int64_t n, float decay, float beta1, float beta2,
               float step_size, float c2_sqrt, float eps, const float* g,
               float* w, float* m, float* v) {
  GPIPE_LAUNCH(AdamWKernel, n, n, decay, beta1, beta2, step_size, c2_sqrt, eps,
               g, w, m, v);
}

}  // namespace gpipe::cuda
