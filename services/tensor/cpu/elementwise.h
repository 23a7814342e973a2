// Elementwise kernels and their gradients. Every output element depends only
// on its own inputs, so threading never changes results.
#ifndef GPIPE_SERVICES_TENSOR_CPU_ELEMENTWISE_H_
#define GPIPE_SERVICES_TENSOR_CPU_ELEMENTWISE_H_

#include <cstdint>

namespace gpipe::cpu {

void Add(int64_t n, const float* a, const float* b, float* out);
void AddInPlace(int64_t n, const float* x, float* y);         // y += x
void Axpy(int64_t n, float alpha, const float* x, float* y);  // y += a*x
void Scale(int64_t n, float alpha, float* x);
void Multiply(int64_t n, const float* a, const float* b, float* out);

// y[r, c] += bias[c]
void AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y);
// y[n, c, i] += bias[c] for i < inner
void AddChannelBias(int64_t n, int64_t channels, int64_t inner,
                    const float* bias, float* y);

void ReluForward(int64_t n, const float* x, float* y);
// dx = dy where y > 0 (y is the forward output).
void ReluBackward(int64_t n, const float* y, const float* dy, float* dx);

// Exact GELU, x * Phi(x), as PyTorch's default.
void GeluForward(int64_t n, const float* x, float* y);
void GeluBackward(int64_t n, const float* x, const float* dy, float* dx);

void TanhForward(int64_t n, const float* x, float* y);
// dx = dy * (1 - y^2), y the forward output.
void TanhBackward(int64_t n, const float* y, const float* dy, float* dx);

// Inverted dropout: element i is kept when UniformAt(key, i) >= p and then
// scaled by 1/(1-p). The mask is a pure function of (key, i).
void DropoutForward(int64_t n, float p, uint64_t key, const float* x, float* y);
void DropoutBackward(int64_t n, float p, uint64_t key, const float* dy,
                     float* dx);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_ELEMENTWISE_H_
