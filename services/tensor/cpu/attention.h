// Multi-head self-attention over fused [q | k | v] rows. Row i of head h
// attends to keys 0..last (last = i when causal); the softmax subtracts
// the row's maximum. The batched forward and backward are GEMMs per
// (sample, head); incremental decoding attends one row at a time
// (AttendRow), so its results agree with the batched forward's to
// rounding, not bitwise (the generator's cached and recomputed scores, both
// row by row, do agree bitwise).
#ifndef GPIPE_SERVICES_TENSOR_CPU_ATTENTION_H_
#define GPIPE_SERVICES_TENSOR_CPU_ATTENTION_H_

#include <cstdint>

namespace gpipe::cpu {

// One query row: scores against keys 0..last (rows `stride` apart, `dh`
// wide), their softmax into pi[0..last], and oi += sum_j pi[j] v_j.
void AttendRow(const float* qi, const float* k, const float* v, int64_t last,
               int64_t stride, int64_t dh, float scale, float* pi, float* oi);

// qkv [batch, t, 3*dim], head h in columns [h*dh, (h+1)*dh) of each part;
// writes probs [batch, heads, t, t] (zero where masked) and out
// [batch, t, dim], both whole.
void AttentionForward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                      bool causal, float scale, const float* qkv, float* probs,
                      float* out);
// Writes dqkv [batch, t, 3*dim] whole from the saved qkv and probs.
void AttentionBackward(int64_t batch, int64_t heads, int64_t t, int64_t dim,
                       bool causal, float scale, const float* qkv,
                       const float* probs, const float* dout, float* dqkv);

// Incremental decoding: query rows [from, to) of the cache qkv [batch, cap,
// 3*dim] (positions), each attending to rows 0..its own, by AttendRow;
// writes out [batch, to - from, dim] whole.
void AttendCachedRows(int64_t batch, int64_t heads, int64_t cap, int64_t from,
                      int64_t to, int64_t dim, float scale, const float* qkv,
                      float* out);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_ATTENTION_H_
