// Max pooling and global average pooling over [planes, H, W] data.
#ifndef GPIPE_SERVICES_TENSOR_CPU_POOL_H_
#define GPIPE_SERVICES_TENSOR_CPU_POOL_H_

#include <cstdint>

namespace gpipe::cpu {

// Windows of kernel x kernel moved by stride, no padding. Saves the flat
// index within the plane of each maximum (first on ties).
void MaxPool2dForward(int64_t planes, int64_t h, int64_t w, int64_t kernel,
                      int64_t stride, const float* x, float* y,
                      int32_t* argmax);
// dx is overwritten.
void MaxPool2dBackward(int64_t planes, int64_t h, int64_t w, int64_t oh,
                       int64_t ow, const float* dy, const int32_t* argmax,
                       float* dx);

void GlobalAvgPoolForward(int64_t planes, int64_t inner, const float* x,
                          float* y);
void GlobalAvgPoolBackward(int64_t planes, int64_t inner, const float* dy,
                           float* dx);

}  // namespace gpipe::cpu

#endif  // GPIPE_SERVICES_TENSOR_CPU_POOL_H_
