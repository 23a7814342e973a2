#include "services/tensor/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "services/tensor/cpu/softmax_row.h"
#include "services/tensor/cpu/vector_clones.h"

namespace gpipe::cpu {

GPIPE_VECTOR_CLONES
void SoftmaxRows(int64_t rows, int64_t cols, const float* x, float* y) {
#pragma omp parallel for if (rows * cols > (1 << 14))
  for (int64_t r = 0; r < rows; ++r)
    SoftmaxRow(cols, x + r * cols, y + r * cols);
}

GPIPE_VECTOR_CLONES
void SoftmaxRowsBackward(int64_t rows, int64_t cols, const float* y,
                         const float* dy, float* dx) {
#pragma omp parallel for if (rows * cols > (1 << 14))
  for (int64_t r = 0; r < rows; ++r)
    SoftmaxRowBackward(cols, y + r * cols, dy + r * cols, 1.0f, dx + r * cols);
}

namespace {

constexpr int64_t kBlock = 256;  // floats a block: in L1

// One row's exps against a running maximum, in one pass over the row: each
// block of kBlock logits is read from memory once for its largest value,
// then again from L1 for its exps. A block that raises the maximum scales
// the sum so far down to it first. The row's largest logit was a pass over
// the row of its own, from memory.
struct RowExps {
  float sum = 0;    // of exp(z - shift) over the row
  float max = 0;    // the largest logit (-inf for none but NaNs and -inf)
  float shift = 0;  // the last block's running maximum (at least -FLT_MAX)
};

typedef float Floats8 __attribute__((vector_size(32)));
typedef int32_t Ints8 __attribute__((vector_size(32)));

// best = v where v > best (not for a NaN v). By reference: a vector passed
// or returned by value changes the baseline clone's ABI (-Wpsabi), though
// all of it is inlined.
[[gnu::always_inline]] inline void KeepLarger(Floats8& best, const Floats8& v) {
  const Ints8 larger = v > best;
  best = reinterpret_cast<Floats8>((reinterpret_cast<Ints8>(v) & larger) |
                                   (reinterpret_cast<Ints8>(best) & ~larger));
}

[[gnu::always_inline]] inline void Load(Floats8& v, const float* p) {
  std::memcpy(&v, p, sizeof v);
}

// The largest of x[0..n) but NaNs (-inf for none), one value whatever the
// order (the two zeros compare equal; callers compare it, never read its
// sign). 32 running maxima in four 8-float vectors, each a variable of its
// own (an array of them stayed on the stack, a store and a reload each
// step), folded in a tree: one chain of maxima waited on each one's
// latency.
[[gnu::always_inline]] inline float LargestOf(int64_t n, const float* x) {
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  Floats8 b0 = Floats8{} + kNone, b1 = b0, b2 = b0, b3 = b0, v;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    Load(v, x + i);
    KeepLarger(b0, v);
    Load(v, x + i + 8);
    KeepLarger(b1, v);
    Load(v, x + i + 16);
    KeepLarger(b2, v);
    Load(v, x + i + 24);
    KeepLarger(b3, v);
  }
  KeepLarger(b0, b1);
  KeepLarger(b2, b3);
  KeepLarger(b0, b2);
  float m = kNone;
  for (int l = 0; l < 8; ++l) m = b0[l] > m ? b0[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// A row's sum of exps in 32 lanes, element i in lane i % 32, four 8-float
// vectors of them added in a fixed tree at the end: the same bits at every
// vector width. Eight lanes in one vector made a chain of dependent adds,
// one every 8 floats.
struct SumLanes {
  Floats8 s0 = {}, s1 = {}, s2 = {}, s3 = {};

  // x[0..n), where x[0] goes to lane 0.
  [[gnu::always_inline]] void Add(const float* x, int64_t n) {
    int64_t i = 0;
    Floats8 v;
    for (; i + 32 <= n; i += 32) {
      Load(v, x + i);
      s0 += v;
      Load(v, x + i + 8);
      s1 += v;
      Load(v, x + i + 16);
      s2 += v;
      Load(v, x + i + 24);
      s3 += v;
    }
    for (int64_t l = 0; i < n; ++i, ++l) {
      Floats8& s = l < 8 ? s0 : l < 16 ? s1 : l < 24 ? s2 : s3;
      s[l % 8] += x[i];
    }
  }
  [[gnu::always_inline]] void Scale(float f) {
    s0 *= f;
    s1 *= f;
    s2 *= f;
    s3 *= f;
  }
  [[gnu::always_inline]] float Total() const {
    const Floats8 t = (s0 + s1) + (s2 + s3);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
  }
};

// Each block's exps are against `shifts[b]` (kept for the gradient, which
// scales block b by exp(shifts[b] - max)), and block b's largest logit is
// `maxima[b]` (for the argmax). `e` null: the exps go to a scratch block.
// Nothing depends on the vector width (SumLanes).
template <bool kKeep>
[[gnu::always_inline]] inline RowExps OnlineExps(int64_t n, const float* z,
                                                 float* e, const float* next_z,
                                                 float* shifts, float* maxima) {
  static_assert(kBlock % 32 == 0);  // a block starts at lane 0
  float scratch[2][kBlock];
  SumLanes lanes;
  // -FLT_MAX, not -inf, while no block has had a finite logit: a -inf
  // logit then shifts to -inf (its exp is 0), where -inf - -inf was NaN.
  float shift = -std::numeric_limits<float>::max();
  float row_max = -std::numeric_limits<float>::infinity();
  // The adds of the block before the one just computed: adds straight
  // after the stores of their block waited on them.
  const float* pending = nullptr;
  int64_t pending_len = 0;
  for (int64_t start = 0, b = 0; start < n; start += kBlock, ++b) {
    const int64_t len = std::min(kBlock, n - start);
    const float* x = z + start;
    const float block_max = LargestOf(len, x);
    maxima[b] = block_max;
    row_max = block_max > row_max ? block_max : row_max;
    if (block_max > shift) {
      // What the lanes hold is against the old shift: add the pending
      // block in, then scale them to the new one.
      if (pending != nullptr) lanes.Add(pending, pending_len);
      pending = nullptr;
      lanes.Scale(ExpOfShifted(shift - block_max));
      shift = block_max;
    }
    shifts[b] = shift;
    float* out = kKeep ? e + start : scratch[b % 2];
#pragma omp simd
    for (int64_t j = 0; j < len; ++j) out[j] = ExpOfShifted(x[j] - shift);
    if (next_z != nullptr)
      for (int64_t j = 0; j < len; j += 16)
        __builtin_prefetch(next_z + start + j, 0, 2);
    if (pending != nullptr) lanes.Add(pending, pending_len);
    pending = out;
    pending_len = len;
  }
  if (pending != nullptr) lanes.Add(pending, pending_len);
  return {lanes.Total(), row_max, shift};
}

// The first index of the row's largest logit, as a scalar scan from z[0]
// with `>` finds it (LaneArgMax's answer): a NaN is never larger, so a NaN
// z[0] is the answer; else the first element equal to the largest, in the
// first block whose largest it is.
[[gnu::always_inline]] inline int64_t FirstLargest(int64_t n, const float* z,
                                                   const float* maxima,
                                                   float max) {
  if (z[0] != z[0]) return 0;
  for (int64_t start = 0, b = 0; start < n; start += kBlock, ++b) {
    if (!(maxima[b] == max)) continue;
    const int64_t end = std::min(n, start + kBlock);
    for (int64_t i = start; i < end; ++i)
      if (z[i] == max) return i;
  }
  return 0;  // not reached: z[0] is NaN, or some block's largest is max
}

}  // namespace

// Vectorized like the softmax (softmax_row.h): libm's exp called twice an
// element, and a sum that waited on each add, took 4% of the triad, a
// second a step for a language model's 32000-token vocabulary. Each row is
// read from memory once (OnlineExps), its gradient scaled in place from L2.
GPIPE_VECTOR_CLONES
CrossEntropyResult SoftmaxCrossEntropy(int64_t rows, int64_t classes,
                                       const float* logits,
                                       const int32_t* targets,
                                       double normalizer, float* dlogits) {
  std::vector<double> row_loss(rows, 0.0);
  std::vector<char> row_correct(rows, 0);
  const float scale = static_cast<float>(1.0 / normalizer);
  const int64_t blocks = (classes + kBlock - 1) / kBlock;
#pragma omp parallel if (rows * classes > (1 << 14))
  {
    std::vector<float> shifts(blocks), maxima(blocks);
#pragma omp for
    for (int64_t r = 0; r < rows; ++r) {
      const float* z = logits + r * classes;
      const int32_t t = targets[r];
      const bool valid = t >= 0 && t < classes;
      float* d = dlogits != nullptr ? dlogits + r * classes : nullptr;
      const float* next_z = r + 1 < rows ? z + classes : nullptr;
      const RowExps x = d != nullptr
                            ? OnlineExps<true>(classes, z, d, next_z,
                                               shifts.data(), maxima.data())
                            : OnlineExps<false>(classes, z, d, next_z,
                                                shifts.data(), maxima.data());
      const float log_s = std::log(x.sum);
      if (valid) {
        row_loss[r] = static_cast<double>(log_s - (z[t] - x.shift));
        row_correct[r] = FirstLargest(classes, z, maxima.data(), x.max) == t;
      }
      if (d == nullptr) continue;
      if (!valid) {
#pragma omp simd
        for (int64_t c = 0; c < classes; ++c) d[c] = 0.0f;
        continue;
      }
      const float inv = 1.0f / x.sum;
      for (int64_t start = 0, b = 0; start < classes; start += kBlock, ++b) {
        // exp(z - shifts[b]) exp(shifts[b] - shift) / sum: 1 once the
        // running maximum is the row's.
        const float g = ExpOfShifted(shifts[b] - x.shift) * inv * scale;
        const int64_t len = std::min(kBlock, classes - start);
        float* block = d + start;
#pragma omp simd
        for (int64_t c = 0; c < len; ++c) block[c] *= g;
      }
      d[t] -= scale;
    }
  }
  CrossEntropyResult result;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[r] != -1 && (targets[r] < 0 || targets[r] >= classes)) {
      ++result.out_of_range;
      continue;
    }
    if (targets[r] < 0) continue;
    result.loss_sum += row_loss[r];
    result.counted += 1;
    result.correct += row_correct[r];
  }
  return result;
}

}  // namespace gpipe::cpu
