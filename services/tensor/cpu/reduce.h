// Reductions with a fixed summation order, so results never depend on the
// number of threads.
#ifndef GPIPE_SERVICES_TENSOR_CPU_REDUCE_H_
#define GPIPE_SERVICES_TENSOR_CPU_REDUCE_H_

#include <cstdint>

namespace gpipe::cpu {

// out[c] += sum over r of x[r, c], rows in order.
void SumRowsInto(int64_t rows, int64_t cols, const float* x, float* out);
// out[c] += sum over n and i of x[n, c, i] (channel sums of NCHW data):
// each plane's sum in float lanes (vector_clones.h's LaneSum), the planes'
// in double in sample order.
void SumChannelsInto(int64_t n, int64_t channels, int64_t inner, const float* x,
                     float* out);
double Sum(int64_t n, const float* x);
// Summed in double in eight lanes (i % 8) added in a fixed tree: a
// function of x alone, whatever the thread count.
double SumSquares(int64_t n, const float* x);
// Index of the largest element (first on ties).
int64_t ArgMax(int64_t n, const float* x);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_REDUCE_H_
