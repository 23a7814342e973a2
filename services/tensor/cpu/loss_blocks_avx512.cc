// The loss's block passes on 16-float AVX-512 registers: the table's 16
// entries are one register and each lookup one permute.
#include <cstdint>
#include <cstring>

#include "services/tensor/cpu/loss_blocks.h"
#include "services/tensor/cpu/table_exp.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*
// (the reductions too), which -W(maybe-)uninitialized reports once inlined
// into a function with a target attribute: a false positive, in the
// compiler's own header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define GPIPE_LOSS_AVX512 1
#endif

namespace gpipe::cpu {

#if GPIPE_LOSS_AVX512
namespace {

#define GPIPE_AVX512 __attribute__((target("avx512f")))

// The lanes of n - j left, of 16.
GPIPE_AVX512 inline __mmask16 Valid(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff)
                    : static_cast<__mmask16>((1u << left) - 1);
}

// TableExp of each of a's lanes where `valid`, else +0: the scalar
// function's operations, in its order.
GPIPE_AVX512 inline __m512 TableExps(__m512 a, __mmask16 valid, __m512 table) {
  const __m512 floor = _mm512_set1_ps(kTableExpFloor);
  // Not below the floor (a NaN is not): the lanes that keep their exp.
  const __mmask16 keep = _mm512_mask_cmp_ps_mask(valid, a, floor, _CMP_NLT_UQ);
  // max(floor, a) is floor > a ? floor : a, a NaN a included.
  const __m512 c = _mm512_max_ps(floor, a);
  const __m512 j =
      _mm512_fmadd_ps(c, _mm512_set1_ps(kSixteenLog2e), _mm512_set1_ps(kRound));
  const __m512 kf = _mm512_sub_ps(j, _mm512_set1_ps(kRound));
  __m512 r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(kLn2HiSixteenth), c);
  r = _mm512_fnmadd_ps(kf, _mm512_set1_ps(kLn2LoSixteenth), r);
  const __m512i m = _mm512_sub_epi32(
      _mm512_castps_si512(j), _mm512_set1_epi32(static_cast<int>(kRoundBits)));
  // The permute reads m's low 4 bits: i.
  const __m512i entry = _mm512_castps_si512(_mm512_permutexvar_ps(m, table));
  const __m512i two_k =
      _mm512_and_si512(_mm512_slli_epi32(m, 19),
                       _mm512_set1_epi32(static_cast<int>(0xff800000u)));
  const __m512 t = _mm512_castsi512_ps(_mm512_add_epi32(entry, two_k));
  const __m512 p = _mm512_fmadd_ps(
      _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 6.0f), r, _mm512_set1_ps(0.5f)), r,
      _mm512_set1_ps(1.0f));
  const __m512 q = _mm512_mul_ps(p, r);
  return _mm512_maskz_fmadd_ps(keep, t, q, t);
}

GPIPE_AVX512 float Largest(int64_t n, const float* x) {
  const __m512 none = _mm512_set1_ps(-__builtin_inff());
  // max(v, b) is v > b ? v : b: a NaN v keeps b, so no lane holds a NaN.
  __m512 b0 = none, b1 = none, b2 = none, b3 = none;
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) {
    b0 = _mm512_max_ps(_mm512_loadu_ps(x + j), b0);
    b1 = _mm512_max_ps(_mm512_loadu_ps(x + j + 16), b1);
    b2 = _mm512_max_ps(_mm512_loadu_ps(x + j + 32), b2);
    b3 = _mm512_max_ps(_mm512_loadu_ps(x + j + 48), b3);
  }
  for (; j < n; j += 16)
    b0 = _mm512_max_ps(_mm512_mask_loadu_ps(none, Valid(n - j), x + j), b0);
  b0 = _mm512_max_ps(_mm512_max_ps(b0, b1), _mm512_max_ps(b2, b3));
  return _mm512_reduce_max_ps(b0);
}

GPIPE_AVX512 void Exps(int64_t n, const float* x, float shift, float* out,
                       float* lanes) {
  __m512 table;
  std::memcpy(&table, kExp2SixteenthsBits, sizeof table);
  const __m512 s = _mm512_set1_ps(shift);
  const __mmask16 all = 0xffff;
  // Lanes 0-15 and 16-31.
  __m512 low = _mm512_loadu_ps(lanes), high = _mm512_loadu_ps(lanes + 16);
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512 e0 =
        TableExps(_mm512_sub_ps(_mm512_loadu_ps(x + j), s), all, table);
    const __m512 e1 =
        TableExps(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16), s), all, table);
    if (out != nullptr) {
      _mm512_storeu_ps(out + j, e0);
      _mm512_storeu_ps(out + j + 16, e1);
    }
    low = _mm512_add_ps(low, e0);
    high = _mm512_add_ps(high, e1);
  }
  // The rest, 16 at a time; a lane past the end adds +0, which changes no
  // lane (a lane is never -0: it starts at +0 and adds exps).
  for (; j < n; j += 16) {
    const __mmask16 valid = Valid(n - j);
    const __m512 e = TableExps(
        _mm512_sub_ps(_mm512_maskz_loadu_ps(valid, x + j), s), valid, table);
    if (out != nullptr) _mm512_mask_storeu_ps(out + j, valid, e);
    if (j % 32 == 0)
      low = _mm512_add_ps(low, e);
    else
      high = _mm512_add_ps(high, e);
  }
  _mm512_storeu_ps(lanes, low);
  _mm512_storeu_ps(lanes + 16, high);
}

constexpr LossBlockKernels kAvx512 = {"avx512", Largest, Exps};

}  // namespace

const LossBlockKernels* LossBlocksAvx512() { return &kAvx512; }
#else
const LossBlockKernels* LossBlocksAvx512() { return nullptr; }
#endif

}  // namespace gpipe::cpu
