// Multi-head self-attention on the GPU as cuBLAS strided-batched GEMMs over
// all (sample, head) pairs: S = scale Q K^T, P = softmax(S) (causal rows
// masked), O = P V, and the backward dV = P^T dO, dP = dO V^T, dS = P (dP -
// rowsum(dP P)) scale, dQ = dS K, dK = dS^T Q. The heads are first copied
// out of the [q | k | v] rows into [sample, head, t, dh] blocks so that one
// batched call covers them all. Row softmaxes are one warp per row with a
// fixed shuffle tree: reproducible, within fp32 rounding of the CPU's loops.
#ifndef GPIPE_SERVICES_TENSOR_CUDA_ATTENTION_H_
#define GPIPE_SERVICES_TENSOR_CUDA_ATTENTION_H_

#include <cstdint>

namespace gpipe::cuda {

// Scratch floats each call needs.
int64_t AttentionForwardScratch(int64_t batch, int64_t heads, int64_t t,
                                int64_t dim);
int64_t AttentionBackwardScratch(int64_t batch, int64_t heads, int64_t t,
                                 int64_t dim);

// qkv [batch, t, 3*dim] rows ([q | k | v], head h in columns [h*dh,
// (h+1)*dh) of each); writes probs [batch, heads, t, t] (zero above the
// diagonal when causal) and out [batch, t, dim].
void AttentionForward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                      bool causal, float scale, const float* qkv, float* probs,
                      float* out, float* scratch);
// Writes dqkv [batch, t, 3*dim] from the saved qkv and probs and dout.
void AttentionBackward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                       bool causal, float scale, const float* qkv,
                       const float* probs, const float* dout, float* dqkv,
                       float* scratch);

// Incremental decoding: query rows [from, to) of the cache qkv [batch, cap,
// 3*dim] (positions), each attending to rows 0..its own; writes out
// [batch, to - from, dim] whole. One thread per (sample, head, row) runs
// cpu::AttendRow's loops in its order (`scratch`: batch * heads *
// (to - from) * to floats for the probabilities).
void AttendCachedRows(int64_t batch, int64_t heads, int64_t cap, int64_t from,
                      int64_t to, int64_t dim, float scale, const float* qkv,
                      float* out, float* scratch);

}  // namespace gpipe::cuda

#endif  // GPIPE_SERVICES_TENSOR_CUDA_ATTENTION_H_
