// The loss's block passes on 8-float AVX2 registers: the table's 16 entries
// are two registers, each lookup two permutes and a blend on bit 3.
#include <cstdint>
#include <cstring>

#include "services/tensor/cpu/loss_blocks.h"
#include "services/tensor/cpu/table_exp.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define GPIPE_LOSS_AVX2 1
#endif

namespace gpipe::cpu {

#if GPIPE_LOSS_AVX2
namespace {

#define GPIPE_AVX2 __attribute__((target("avx2,fma")))

// All ones in the lanes of n - j left, of 8.
GPIPE_AVX2 inline __m256i Valid(int64_t left) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(
      _mm256_set1_epi32(static_cast<int>(left < 8 ? left : 8)), lane);
}

// x[0..min(left, 8)) and `fill` past them. Through a copy on the stack:
// whether a masked load may fault on the masked-out lanes' memory is the
// implementation's choice on AMD's CPUs, and a tail ends at the row's end.
GPIPE_AVX2 inline __m256 LoadTail(const float* x, int64_t left, __m256 fill) {
  float buffer[8];
  _mm256_storeu_ps(buffer, fill);
  std::memcpy(buffer, x, (left < 8 ? left : 8) * sizeof(float));
  return _mm256_loadu_ps(buffer);
}

// v's first min(left, 8) lanes to y.
GPIPE_AVX2 inline void StoreTail(float* y, int64_t left, __m256 v) {
  float buffer[8];
  _mm256_storeu_ps(buffer, v);
  std::memcpy(y, buffer, (left < 8 ? left : 8) * sizeof(float));
}

struct Table {
  __m256 low, high;  // entries 0-7 and 8-15
};

// TableExp of each of a's lanes where `valid`, else +0: the scalar
// function's operations, in its order.
GPIPE_AVX2 inline __m256 TableExps(__m256 a, __m256i valid,
                                   const Table& table) {
  const __m256 floor = _mm256_set1_ps(kTableExpFloor);
  // Not below the floor (a NaN is not): the lanes that keep their exp.
  const __m256 keep = _mm256_and_ps(_mm256_cmp_ps(a, floor, _CMP_NLT_UQ),
                                    _mm256_castsi256_ps(valid));
  // max(floor, a) is floor > a ? floor : a, a NaN a included.
  const __m256 c = _mm256_max_ps(floor, a);
  const __m256 j =
      _mm256_fmadd_ps(c, _mm256_set1_ps(kSixteenLog2e), _mm256_set1_ps(kRound));
  const __m256 kf = _mm256_sub_ps(j, _mm256_set1_ps(kRound));
  __m256 r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(kLn2HiSixteenth), c);
  r = _mm256_fnmadd_ps(kf, _mm256_set1_ps(kLn2LoSixteenth), r);
  const __m256i m = _mm256_sub_epi32(
      _mm256_castps_si256(j), _mm256_set1_epi32(static_cast<int>(kRoundBits)));
  // Each permute reads m's low 3 bits; bit 3, moved to the sign, picks the
  // half.
  const __m256 entry =
      _mm256_blendv_ps(_mm256_permutevar8x32_ps(table.low, m),
                       _mm256_permutevar8x32_ps(table.high, m),
                       _mm256_castsi256_ps(_mm256_slli_epi32(m, 28)));
  const __m256i two_k =
      _mm256_and_si256(_mm256_slli_epi32(m, 19),
                       _mm256_set1_epi32(static_cast<int>(0xff800000u)));
  const __m256 t =
      _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(entry), two_k));
  const __m256 p = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_set1_ps(1.0f / 6.0f), r, _mm256_set1_ps(0.5f)), r,
      _mm256_set1_ps(1.0f));
  const __m256 q = _mm256_mul_ps(p, r);
  return _mm256_and_ps(_mm256_fmadd_ps(t, q, t), keep);
}

GPIPE_AVX2 float Largest(int64_t n, const float* x) {
  const __m256 none = _mm256_set1_ps(-__builtin_inff());
  // max(v, b) is v > b ? v : b: a NaN v keeps b, so no lane holds a NaN.
  __m256 b0 = none, b1 = none, b2 = none, b3 = none;
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    b0 = _mm256_max_ps(_mm256_loadu_ps(x + j), b0);
    b1 = _mm256_max_ps(_mm256_loadu_ps(x + j + 8), b1);
    b2 = _mm256_max_ps(_mm256_loadu_ps(x + j + 16), b2);
    b3 = _mm256_max_ps(_mm256_loadu_ps(x + j + 24), b3);
  }
  for (; j < n; j += 8) b0 = _mm256_max_ps(LoadTail(x + j, n - j, none), b0);
  b0 = _mm256_max_ps(_mm256_max_ps(b0, b1), _mm256_max_ps(b2, b3));
  // Halves, then pairs, then neighbours: the order does not matter.
  __m128 h =
      _mm_max_ps(_mm256_castps256_ps128(b0), _mm256_extractf128_ps(b0, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

GPIPE_AVX2 void Exps(int64_t n, const float* x, float shift, float* out,
                     float* lanes) {
  Table table;
  std::memcpy(&table.low, kExp2SixteenthsBits, sizeof table.low);
  std::memcpy(&table.high, kExp2SixteenthsBits + 8, sizeof table.high);
  const __m256 s = _mm256_set1_ps(shift);
  const __m256i all = _mm256_set1_epi32(-1);
  __m256 l0 = _mm256_loadu_ps(lanes), l1 = _mm256_loadu_ps(lanes + 8);
  __m256 l2 = _mm256_loadu_ps(lanes + 16), l3 = _mm256_loadu_ps(lanes + 24);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m256 e0 =
        TableExps(_mm256_sub_ps(_mm256_loadu_ps(x + j), s), all, table);
    const __m256 e1 =
        TableExps(_mm256_sub_ps(_mm256_loadu_ps(x + j + 8), s), all, table);
    const __m256 e2 =
        TableExps(_mm256_sub_ps(_mm256_loadu_ps(x + j + 16), s), all, table);
    const __m256 e3 =
        TableExps(_mm256_sub_ps(_mm256_loadu_ps(x + j + 24), s), all, table);
    if (out != nullptr) {
      _mm256_storeu_ps(out + j, e0);
      _mm256_storeu_ps(out + j + 8, e1);
      _mm256_storeu_ps(out + j + 16, e2);
      _mm256_storeu_ps(out + j + 24, e3);
    }
    l0 = _mm256_add_ps(l0, e0);
    l1 = _mm256_add_ps(l1, e1);
    l2 = _mm256_add_ps(l2, e2);
    l3 = _mm256_add_ps(l3, e3);
  }
  // The rest, 8 at a time; a lane past the end adds +0, which changes no
  // lane (a lane is never -0: it starts at +0 and adds exps).
  for (; j < n; j += 8) {
    const __m256i valid = Valid(n - j);
    const __m256 e =
        TableExps(_mm256_sub_ps(LoadTail(x + j, n - j, _mm256_setzero_ps()), s),
                  valid, table);
    if (out != nullptr) StoreTail(out + j, n - j, e);
    __m256& lane = j % 32 == 0 ? l0 : j % 32 == 8 ? l1 : j % 32 == 16 ? l2 : l3;
    lane = _mm256_add_ps(lane, e);
  }
  _mm256_storeu_ps(lanes, l0);
  _mm256_storeu_ps(lanes + 8, l1);
  _mm256_storeu_ps(lanes + 16, l2);
  _mm256_storeu_ps(lanes + 24, l3);
}

constexpr LossBlockKernels kAvx2 = {"avx2", Largest, Exps};

}  // namespace

const LossBlockKernels* LossBlocksAvx2() { return &kAvx2; }
#else
const LossBlockKernels* LossBlocksAvx2() { return nullptr; }
#endif

}  // namespace gpipe::cpu
