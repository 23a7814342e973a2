// Dropout's keep mask with AVX-512 intrinsics, for CPUs with AVX-512DQ (its
// 64-bit multiply). GCC's x86-64-v4 clone of the plain loop multiplies each
// element's index by SplitMix64's gamma and finishes the whole mix: six
// 64-bit multiplies for sixteen floats, 44% of the triad on a Zen 5 core.
// Written out, the counter is an induction variable (four multiplies) and
// the mix's last shift, which leaves the 24 bits the mask keeps as they
// are, is left out.
#ifndef GPIPE_SERVICES_TENSOR_CPU_DROPOUT_AVX512_H_
#define GPIPE_SERVICES_TENSOR_CPU_DROPOUT_AVX512_H_

#include <cstdint>

namespace gpipe::cpu {

// Whether this CPU has AVX-512DQ, so DropoutRangeAvx512 runs.
bool DropoutHasAvx512();

// DropoutForward's result bit for bit on elements [begin, end) (UniformAt(
// key, i) >= p keeps x[i] / (1 - p)), on the calling thread. Returns
// false, writing nothing, where the CPU lacks AVX-512DQ.
bool DropoutRangeAvx512(int64_t begin, int64_t end, float p, uint64_t key,
                        const float* x, float* y);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_DROPOUT_AVX512_H_
