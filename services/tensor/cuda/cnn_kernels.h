// CUDA kernels of the convolutional layers: im2col/col2im, the layout moves
// around the convolution GEMM, channel bias and sums, max and global average
// pooling, batch norm. Same arithmetic order as the CPU kernels in ../cpu/
// wherever that costs nothing, so all but batch norm's statistics are
// bitwise the CPU's; no atomics anywhere, so GPU runs are reproducible.
// Device pointers, queued on the thread's current stream (runtime.h).
#ifndef GPIPE_SERVICES_TENSOR_CUDA_CNN_KERNELS_H_
#define GPIPE_SERVICES_TENSOR_CUDA_CNN_KERNELS_H_

#include <cstdint>

#include "services/tensor/cpu/conv.h"

namespace gpipe::cuda {

// cpu::Im2Col of `nb` samples side by side: col is [C*k*k, nb*OH*OW].
void Im2ColBatch(const cpu::ConvGeometry& g, int64_t nb, const float* x,
                 float* col);
// cpu::Col2Im of `nb` samples: dx += the adjoint of Im2ColBatch. One thread
// per input element gathers its window entries in the CPU's order (kernel
// row, then kernel column), so the sums are bitwise the CPU's.
void Col2ImBatch(const cpu::ConvGeometry& g, int64_t nb, const float* col,
                 float* dx);
// [C, nb*inner] (the GEMM's output) to [nb, C, inner] (NCHW) and back.
void ChunkToNchw(int64_t nb, int64_t channels, int64_t inner, const float* in,
                 float* out);
void NchwToChunk(int64_t nb, int64_t channels, int64_t inner, const float* in,
                 float* out);
// y[n, c, i] += bias[c].
void AddChannelBias(int64_t n, int64_t channels, int64_t inner,
                    const float* bias, float* y);
// out[c] += sum over n and i of x[n, c, i], as cpu::SumChannelsInto: a float
// sum per (n, c) plane, then a double sum over n in order. `scratch` holds
// n*channels floats.
void SumChannelsInto(int64_t n, int64_t channels, int64_t inner, const float* x,
                     float* out, float* scratch);

// As cpu::MaxPool2dForward / Backward (first maximum on ties; the backward
// gathers, per input element, the outputs that chose it in output order).
void MaxPool2dForward(int64_t planes, int64_t h, int64_t w, int64_t kernel,
                      int64_t stride, const float* x, float* y,
                      int32_t* argmax);
void MaxPool2dBackward(int64_t planes, int64_t h, int64_t w, int64_t kernel,
                       int64_t stride, const float* dy, const int32_t* argmax,
                       float* dx);
void GlobalAvgPoolForward(int64_t planes, int64_t inner, const float* x,
                          float* y);
void GlobalAvgPoolBackward(int64_t planes, int64_t inner, const float* dy,
                           float* dx);

// Batch norm over [batch, channels, inner], one block per channel. With
// `batch_stats` the statistics are the batch's (double sums in a fixed
// tree: within double rounding of the CPU's sequential sums) and, when
// `update_running`, the running averages move; otherwise the running
// averages normalize. The mean that normalized goes to `mean` unless it is
// null (no backward follows).
void BatchNormForward(int64_t batch, int64_t channels, int64_t inner,
                      bool batch_stats, bool update_running, float momentum,
                      float eps, const float* x, const float* gamma,
                      const float* beta, float* running_mean,
                      float* running_var, float* y, float* mean, float* rstd);
// dx from the forward's input and its saved mean and rstd (the normalized
// input made again); dgamma and dbeta accumulate.
void BatchNormBackward(int64_t batch, int64_t channels, int64_t inner,
                       const float* x, const float* mean, const float* rstd,
                       const float* gamma, const float* dy, float* dx,
                       float* dgamma, float* dbeta);

}  // namespace gpipe::cuda

#endif  // GPIPE_SERVICES_TENSOR_CUDA_CNN_KERNELS_H_
