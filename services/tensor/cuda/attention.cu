// Self-attention by strided-batched GEMMs (attention.h): head split/merge
// copies and the two masked row kernels; the products are cuBLAS's.
#include <cuda_runtime.h>

#include "services/tensor/cuda/attention.h"
#include "services/tensor/cuda/kernels.h"
#include "services/tensor/cuda/launch.cuh"
#include "services/tensor/cuda/runtime.h"

namespace gpipe::cuda {
namespace {

// Element e of dst [parts][batch, heads, t, dh] and where it sits in rows
// of `parts` blocks of dim = heads*dh (the [q | k | v] layout when parts
// is 3, the heads' output when 1).
__device__ int64_t RowIndex(int64_t e, int64_t batch, int64_t heads, int64_t t,
                            int64_t dh, int64_t parts) {
  const int64_t dim = heads * dh, per_part = batch * t * dim;
  const int64_t part = e / per_part, r = e % per_part;
  const int64_t b = r / (heads * t * dh), h = (r / (t * dh)) % heads;
  const int64_t i = (r / dh) % t, c = r % dh;
  return (b * t + i) * parts * dim + part * dim + h * dh + c;
}
__global__ void SplitHeadsKernel(int64_t batch, int64_t heads, int64_t t,
                                 int64_t dh, int64_t parts, const float* rows,
                                 float* blocks) {
  GPIPE_FOR_EACH(e, parts * batch * t * heads * dh)
  blocks[e] = rows[RowIndex(e, batch, heads, t, dh, parts)];
}
__global__ void MergeHeadsKernel(int64_t batch, int64_t heads, int64_t t,
                                 int64_t dh, int64_t parts, const float* blocks,
                                 float* rows) {
  GPIPE_FOR_EACH(e, parts * batch * t * heads * dh)
  rows[RowIndex(e, batch, heads, t, dh, parts)] = blocks[e];
}

// Rows of t scores; row r is query r % t. Entries past the last visible
// key become 0, as the CPU leaves them.
__global__ void MaskedSoftmaxKernel(int64_t rows, int64_t t, bool causal,
                                    float* p) {
  const int lane = threadIdx.x % kWarp;
  GPIPE_FOR_EACH_ROW(row, rows) {
    float* pr = p + row * t;
    const int64_t last = causal ? row % t : t - 1;
    float m = -INFINITY;
    for (int64_t j = lane; j <= last; j += kWarp) m = fmaxf(m, pr[j]);
    m = WarpMax(m);
    float s = 0.0f;
    for (int64_t j = lane; j <= last; j += kWarp) {
      const float e = expf(pr[j] - m);
      pr[j] = e;
      s += e;
    }
    const float inv = 1.0f / WarpSum(s);
    for (int64_t j = lane; j < t; j += kWarp)
      pr[j] = j <= last ? pr[j] * inv : 0.0f;
  }
}
// dS = P (dP - rowsum(dP P)) scale, in place of dP.
__global__ void SoftmaxBackwardKernel(int64_t rows, int64_t t, bool causal,
                                      float scale, const float* p, float* dp) {
  const int lane = threadIdx.x % kWarp;
  GPIPE_FOR_EACH_ROW(row, rows) {
    const float* pr = p + row * t;
    float* dr = dp + row * t;
    const int64_t last = causal ? row % t : t - 1;
    float dot = 0.0f;
    for (int64_t j = lane; j <= last; j += kWarp) dot += dr[j] * pr[j];
    dot = WarpSum(dot);
    for (int64_t j = lane; j < t; j += kWarp)
      dr[j] = j <= last ? pr[j] * (dr[j] - dot) * scale : 0.0f;
  }
}

int RowBlocks(int64_t rows) {
  const int64_t b = (rows * kWarp + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 ? (b < 1 ? 1 : b) : 65535);
}

void SplitHeads(int64_t batch, int64_t heads, int64_t t, int64_t dh,
                int64_t parts, const float* rows, float* blocks) {
  const int64_t n = parts * batch * t * heads * dh;
  if (n == 0) return;
  SplitHeadsKernel<<<Blocks(n), kThreads, 0, Current()>>>(batch, heads, t, dh,
                                                          parts, rows, blocks);
  CheckLastError("SplitHeadsKernel");
}
void MergeHeads(int64_t batch, int64_t heads, int64_t t, int64_t dh,
                int64_t parts, const float* blocks, float* rows) {
  const int64_t n = parts * batch * t * heads * dh;
  if (n == 0) return;
  MergeHeadsKernel<<<Blocks(n), kThreads, 0, Current()>>>(batch, heads, t, dh,
                                                          parts, blocks, rows);
  CheckLastError("MergeHeadsKernel");
}

}  // namespace

int64_t AttentionForwardScratch(int64_t batch, int64_t, int64_t t,
                                int64_t dim) {
  return 4 * batch * t * dim;  // q, k, v and the heads' output as blocks
}
int64_t AttentionBackwardScratch(int64_t batch, int64_t heads, int64_t t,
                                 int64_t dim) {
  // q, k, v; dout; dq, dk, dv (blocks); dP.
  return 7 * batch * t * dim + batch * heads * t * t;
}

void AttentionForward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                      bool causal, float scale, const float* qkv, float* probs,
                      float* out, float* scratch) {
  const int64_t bh = batch * heads, dh = dim / heads, n = batch * t * dim;
  if (bh == 0 || t == 0) return;
  float* q = scratch;
  float* k = q + n;
  float* v = k + n;
  float* o = v + n;
  SplitHeads(batch, heads, t, dh, 3, qkv, q);
  GemmStridedBatched(false, true, t, t, dh, scale, q, t * dh, k, t * dh, 0.0f,
                     probs, t * t, bh);
  MaskedSoftmaxKernel<<<RowBlocks(bh * t), kThreads, 0, Current()>>>(
      bh * t, t, causal, probs);
  CheckLastError("MaskedSoftmaxKernel");
  GemmStridedBatched(false, false, t, dh, t, 1.0f, probs, t * t, v, t * dh,
                     0.0f, o, t * dh, bh);
  MergeHeads(batch, heads, t, dh, 1, o, out);
}

void AttentionBackward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                       bool causal, float scale, const float* qkv,
                       const float* probs, const float* dout, float* dqkv,
                       float* scratch) {
  const int64_t bh = batch * heads, dh = dim / heads, n = batch * t * dim;
  if (bh == 0 || t == 0) return;
  float* q = scratch;
  float* k = q + n;
  float* v = k + n;
  float* go = v + n;
  float* dq = go + n;
  float* dk = dq + n;
  float* dv = dk + n;
  float* ds = dv + n;
  SplitHeads(batch, heads, t, dh, 3, qkv, q);
  SplitHeads(batch, heads, t, dh, 1, dout, go);
  GemmStridedBatched(true, false, t, dh, t, 1.0f, probs, t * t, go, t * dh,
                     0.0f, dv, t * dh, bh);
  GemmStridedBatched(false, true, t, t, dh, 1.0f, go, t * dh, v, t * dh, 0.0f,
                     ds, t * t, bh);
  SoftmaxBackwardKernel<<<RowBlocks(bh * t), kThreads, 0, Current()>>>(
      bh * t, t, causal, scale, probs, ds);
  CheckLastError("SoftmaxBackwardKernel");
  GemmStridedBatched(false, false, t, dh, t, 1.0f, ds, t * t, k, t * dh, 0.0f,
                     dq, t * dh, bh);
  GemmStridedBatched(true, false, t, dh, t, 1.0f, ds, t * t, q, t * dh, 0.0f,
                     dk, t * dh, bh);
  MergeHeads(batch, heads, t, dh, 3, dq, dqkv);
}

namespace {
// One (sample, head, query row) per thread, cpu::AttendRow's loops.
__global__ void AttendCachedRowsKernel(int64_t batch, int64_t heads,
                                       int64_t cap, int64_t from, int64_t to,
                                       int64_t dim, float scale,
                                       const float* qkv, float* out,
                                       float* scratch) {
  const int64_t n = to - from, dh = dim / heads, stride = 3 * dim;
  GPIPE_FOR_EACH(e, batch * heads * n) {
    const int64_t b = e / (heads * n), h = (e / n) % heads, r = e % n;
    const int64_t i = from + r;
    const float* base = qkv + b * cap * stride + h * dh;
    const float* qi = base + i * stride;
    const float* k = base + dim;
    const float* v = base + 2 * dim;
    float* p = scratch + e * to;
    float* oi = out + (b * n + r) * dim + h * dh;
    for (int64_t c = 0; c < dh; ++c) oi[c] = 0.0f;
    float m = -INFINITY;
    for (int64_t j = 0; j <= i; ++j) {
      float s = 0.0f;
      for (int64_t c = 0; c < dh; ++c) s += qi[c] * k[j * stride + c];
      p[j] = s * scale;
      m = p[j] > m ? p[j] : m;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j <= i; ++j) {
      p[j] = expf(p[j] - m);
      sum += p[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j <= i; ++j) {
      p[j] *= inv;
      const float* vj = v + j * stride;
      for (int64_t c = 0; c < dh; ++c) oi[c] += p[j] * vj[c];
    }
  }
}
}  // namespace

void AttendCachedRows(int64_t batch, int64_t heads, int64_t cap, int64_t from,
                      int64_t to, int64_t dim, float scale, const float* qkv,
                      float* out, float* scratch) {
  GPIPE_LAUNCH(AttendCachedRowsKernel, batch * heads * (to - from), batch,
               heads, cap, from, to, dim, scale, qkv, out, scratch);
}

}  // namespace gpipe::cuda
