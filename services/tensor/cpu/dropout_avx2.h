// Dropout's keep mask with AVX2 intrinsics, for CPUs that have AVX2 and not
// AVX-512. The mask's SplitMix64 mix is two 64-bit multiplies an element;
// AVX2 has no 64-bit multiply, and GCC's vectorized loop (the x86-64-v3
// clone) builds each from three 32-bit ones, the counter's product included:
// 18% of the triad on a Zen 3 core against AVX-512's 60%. Written out, the
// counter is an induction variable and the last product is taken only as far
// as the 24 bits the mask keeps.
#ifndef GPIPE_SERVICES_TENSOR_CPU_DROPOUT_AVX2_H_
#define GPIPE_SERVICES_TENSOR_CPU_DROPOUT_AVX2_H_

#include <cstdint>

namespace gpipe::cpu {

// Whether DropoutForward runs DropoutForwardAvx2 on this CPU: it has AVX2
// and lacks AVX-512DQ's 64-bit multiply (where it has it, the x86-64-v4
// clone is faster).
bool DropoutPrefersAvx2();

// DropoutForward's result bit for bit on elements [begin, end) (UniformAt(
// key, i) >= p keeps x[i] / (1 - p)), on the calling thread. Returns
// false, writing nothing, where the CPU lacks AVX2.
bool DropoutRangeAvx2(int64_t begin, int64_t end, float p, uint64_t key,
                      const float* x, float* y);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_DROPOUT_AVX2_H_
