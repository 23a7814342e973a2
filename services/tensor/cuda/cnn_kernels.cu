// The convolutional layers' kernels (cnn_kernels.h): grid-stride loops with
// one thread per output element, and one block per channel for batch norm.
#include <cuda_runtime.h>

#include "services/tensor/cuda/cnn_kernels.h"
#include "services/tensor/cuda/launch.cuh"
#include "services/tensor/cuda/runtime.h"

namespace gpipe::cuda {
namespace {

// col[(c*k + ki)*k + kj, s*OH*OW + i*OW + j] for sample s.
// (oh, ow) come from the host: ConvGeometry's members are host functions.
__global__ void Im2ColKernel(cpu::ConvGeometry g, int64_t oh, int64_t ow,
                             int64_t nb, const float* x, float* col) {
  const int64_t k = g.kernel;
  const int64_t hw = oh * ow, ld = nb * hw;
  GPIPE_FOR_EACH(e, g.channels * k * k * ld) {
    const int64_t row = e / ld, at = e % ld;
    const int64_t s = at / hw, i = (at % hw) / ow, j = at % ow;
    const int64_t c = row / (k * k), ki = (row / k) % k, kj = row % k;
    const int64_t y = i * g.stride - g.padding + ki;
    const int64_t xx = j * g.stride - g.padding + kj;
    col[e] = (y >= 0 && y < g.height && xx >= 0 && xx < g.width)
                 ? x[((s * g.channels + c) * g.height + y) * g.width + xx]
                 : 0.0f;
  }
}

__global__ void Col2ImKernel(cpu::ConvGeometry g, int64_t oh, int64_t ow,
                             int64_t nb, const float* col, float* dx) {
  const int64_t k = g.kernel;
  const int64_t hw = oh * ow, ld = nb * hw;
  const int64_t plane = g.height * g.width;
  GPIPE_FOR_EACH(e, nb * g.channels * plane) {
    const int64_t s = e / (g.channels * plane);
    const int64_t c = (e / plane) % g.channels;
    const int64_t y = (e % plane) / g.width, xx = e % g.width;
    float acc = dx[e];
    for (int64_t ki = 0; ki < k; ++ki) {
      const int64_t iy = y + g.padding - ki;
      if (iy < 0 || iy % g.stride != 0 || iy / g.stride >= oh) continue;
      const int64_t i = iy / g.stride;
      for (int64_t kj = 0; kj < k; ++kj) {
        const int64_t jx = xx + g.padding - kj;
        if (jx < 0 || jx % g.stride != 0 || jx / g.stride >= ow) continue;
        acc +=
            col[((c * k + ki) * k + kj) * ld + s * hw + i * ow + jx / g.stride];
      }
    }
    dx[e] = acc;
  }
}

__global__ void ChunkToNchwKernel(int64_t nb, int64_t channels, int64_t inner,
                                  const float* in, float* out) {
  GPIPE_FOR_EACH(e, nb * channels * inner) {
    const int64_t s = e / (channels * inner), c = (e / inner) % channels;
    out[e] = in[c * nb * inner + s * inner + e % inner];
  }
}
__global__ void NchwToChunkKernel(int64_t nb, int64_t channels, int64_t inner,
                                  const float* in, float* out) {
  GPIPE_FOR_EACH(e, nb * channels * inner) {
    const int64_t s = e / (channels * inner), c = (e / inner) % channels;
    out[c * nb * inner + s * inner + e % inner] = in[e];
  }
}
__global__ void AddChannelBiasKernel(int64_t n, int64_t channels, int64_t inner,
                                     const float* bias, float* y) {
  GPIPE_FOR_EACH(e, n * channels * inner) y[e] += bias[(e / inner) % channels];
}
__global__ void PlaneSumsKernel(int64_t planes, int64_t inner, const float* x,
                                float* sums) {
  // The CPU's order (cpu::LaneSum): element i into lane i % 8, the lanes
  // added in its fixed tree, so the bias gradient is the CPU's bits.
  GPIPE_FOR_EACH(p, planes) {
    const float* row = x + p * inner;
    float lane[8] = {};
    int64_t i = 0;
    for (; i + 8 <= inner; i += 8) {
#pragma unroll
      for (int l = 0; l < 8; ++l) lane[l] += row[i + l];
    }
    for (int l = 0; i < inner; ++i, ++l) lane[l] += row[i];
    sums[p] = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
              ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
}
__global__ void ChannelSumsKernel(int64_t n, int64_t channels,
                                  const float* plane_sums, float* out) {
  GPIPE_FOR_EACH(c, channels) {
    double acc = 0.0;
    for (int64_t b = 0; b < n; ++b) acc += plane_sums[b * channels + c];
    out[c] += static_cast<float>(acc);
  }
}

__global__ void MaxPoolForwardKernel(int64_t planes, int64_t h, int64_t w,
                                     int64_t kernel, int64_t stride,
                                     const float* x, float* y,
                                     int32_t* argmax) {
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  GPIPE_FOR_EACH(o, planes * oh * ow) {
    const int64_t p = o / (oh * ow), i = (o / ow) % oh, j = o % ow;
    const float* in = x + p * h * w;
    int64_t best = (i * stride) * w + j * stride;
    for (int64_t ki = 0; ki < kernel; ++ki)
      for (int64_t kj = 0; kj < kernel; ++kj) {
        const int64_t at = (i * stride + ki) * w + j * stride + kj;
        if (in[at] > in[best]) best = at;
      }
    y[o] = in[best];
    argmax[o] = static_cast<int32_t>(best);
  }
}
// Outputs (i, j) whose window holds input (y, x), in increasing order: the
// order in which the CPU adds them.
__global__ void MaxPoolBackwardKernel(int64_t planes, int64_t h, int64_t w,
                                      int64_t kernel, int64_t stride,
                                      const float* dy, const int32_t* argmax,
                                      float* dx) {
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  GPIPE_FOR_EACH(e, planes * h * w) {
    const int64_t p = e / (h * w), at = e % (h * w);
    const int64_t y = at / w, x = at % w;
    const int64_t i0 = y >= kernel ? (y - kernel) / stride + 1 : 0;
    const int64_t j0 = x >= kernel ? (x - kernel) / stride + 1 : 0;
    const int64_t i1 = y / stride < oh - 1 ? y / stride : oh - 1;
    const int64_t j1 = x / stride < ow - 1 ? x / stride : ow - 1;
    float acc = 0.0f;
    for (int64_t i = i0; i <= i1; ++i)
      for (int64_t j = j0; j <= j1; ++j) {
        const int64_t o = (p * oh + i) * ow + j;
        if (argmax[o] == at) acc += dy[o];
      }
    dx[e] = acc;
  }
}
__global__ void GlobalAvgPoolForwardKernel(int64_t planes, int64_t inner,
                                           const float* x, float* y) {
  GPIPE_FOR_EACH(p, planes) {
    float s = 0.0f;
    for (int64_t i = 0; i < inner; ++i) s += x[p * inner + i];
    y[p] = s / inner;
  }
}
__global__ void GlobalAvgPoolBackwardKernel(int64_t planes, int64_t inner,
                                            const float* dy, float* dx) {
  GPIPE_FOR_EACH(e, planes * inner) dx[e] = dy[e / inner] / inner;
}

// Sums v over the block in a fixed tree; every thread gets the total.
__device__ double BlockSum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) shared[threadIdx.x] += shared[threadIdx.x + w];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

// Block c normalizes channel c; element e of the channel is sample e /
// inner, position e % inner.
__global__ void BatchNormForwardKernel(
    int64_t batch, int64_t channels, int64_t inner, bool batch_stats,
    bool update_running, float momentum, float eps, const float* x,
    const float* gamma, const float* beta, float* running_mean,
    float* running_var, float* y, float* saved_mean, float* rstd) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.x, n = batch * inner;
  auto at = [&](int64_t e) {
    return (e / inner * channels + c) * inner + e % inner;
  };
  float mean, var;
  if (batch_stats) {
    double s = 0.0;
    for (int64_t e = threadIdx.x; e < n; e += kThreads) s += x[at(e)];
    mean = static_cast<float>(BlockSum(s, shared) / n);
    double ss = 0.0;
    for (int64_t e = threadIdx.x; e < n; e += kThreads) {
      const double d = x[at(e)] - mean;  // a float difference, as the CPU's
      ss += d * d;
    }
    ss = BlockSum(ss, shared);
    var = static_cast<float>(ss / n);
    if (update_running && threadIdx.x == 0) {
      const float unbiased = n > 1 ? static_cast<float>(ss / (n - 1)) : var;
      running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * mean;
      running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
    }
  } else {
    mean = running_mean[c];
    var = running_var[c];
  }
  const float r = 1.0f / sqrtf(var + eps);
  if (threadIdx.x == 0) {
    rstd[c] = r;
    if (saved_mean != nullptr) saved_mean[c] = mean;
  }
  const float g = gamma[c], b = beta[c];
  for (int64_t e = threadIdx.x; e < n; e += kThreads) {
    const int64_t i = at(e);
    const float h = (x[i] - mean) * r;
    y[i] = h * g + b;
  }
}

__global__ void BatchNormBackwardKernel(int64_t batch, int64_t channels,
                                        int64_t inner, const float* x,
                                        const float* mean, const float* rstd,
                                        const float* gamma, const float* dy,
                                        float* dx, float* dgamma,
                                        float* dbeta) {
  __shared__ double shared[kThreads];
  const int64_t c = blockIdx.x, n = batch * inner;
  auto at = [&](int64_t e) {
    return (e / inner * channels + c) * inner + e % inner;
  };
  // The normalized input, made again as the forward made it.
  const float m = mean[c], r = rstd[c];
  auto xhat = [&](int64_t i) { return (x[i] - m) * r; };
  double s = 0.0, sx = 0.0;
  for (int64_t e = threadIdx.x; e < n; e += kThreads) {
    const int64_t i = at(e);
    s += dy[i];
    sx += static_cast<double>(dy[i]) * xhat(i);
  }
  const double sum_dy = BlockSum(s, shared);
  const double sum_dy_xhat = BlockSum(sx, shared);
  if (threadIdx.x == 0) {
    dgamma[c] += static_cast<float>(sum_dy_xhat);
    dbeta[c] += static_cast<float>(sum_dy);
  }
  const float k = gamma[c] * r / n;
  const float fs = static_cast<float>(sum_dy);
  const float fsx = static_cast<float>(sum_dy_xhat);
  for (int64_t e = threadIdx.x; e < n; e += kThreads) {
    const int64_t i = at(e);
    dx[i] = k * (n * dy[i] - fs - xhat(i) * fsx);
  }
}

}  // namespace

void Im2ColBatch(const cpu::ConvGeometry& g, int64_t nb, const float* x,
                 float* col) {
  const int64_t n =
      g.channels * g.kernel * g.kernel * nb * g.out_height() * g.out_width();
  GPIPE_LAUNCH(Im2ColKernel, n, g, g.out_height(), g.out_width(), nb, x, col);
}
void Col2ImBatch(const cpu::ConvGeometry& g, int64_t nb, const float* col,
                 float* dx) {
  GPIPE_LAUNCH(Col2ImKernel, nb * g.channels * g.height * g.width, g,
               g.out_height(), g.out_width(), nb, col, dx);
}
void ChunkToNchw(int64_t nb, int64_t channels, int64_t inner, const float* in,
                 float* out) {
  GPIPE_LAUNCH(ChunkToNchwKernel, nb * channels * inner, nb, channels, inner,
               in, out);
}
void NchwToChunk(int64_t nb, int64_t channels, int64_t inner, const float* in,
                 float* out) {
  GPIPE_LAUNCH(NchwToChunkKernel, nb * channels * inner, nb, channels, inner,
               in, out);
}
void AddChannelBias(int64_t n, int64_t channels, int64_t inner,
                    const float* bias, float* y) {
  GPIPE_LAUNCH(AddChannelBiasKernel, n * channels * inner, n, channels, inner,
               bias, y);
}
void SumChannelsInto(int64_t n, int64_t channels, int64_t inner, const float* x,
                     float* out, float* scratch) {
  GPIPE_LAUNCH(PlaneSumsKernel, n * channels, n * channels, inner, x, scratch);
  GPIPE_LAUNCH(ChannelSumsKernel, channels, n, channels, scratch, out);
}
void MaxPool2dForward(int64_t planes, int64_t h, int64_t w, int64_t kernel,
                      int64_t stride, const float* x, float* y,
                      int32_t* argmax) {
  const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
  GPIPE_LAUNCH(MaxPoolForwardKernel, planes * oh * ow, planes, h, w, kernel,
               stride, x, y, argmax);
}
void MaxPool2dBackward(int64_t planes, int64_t h, int64_t w, int64_t kernel,
                       int64_t stride, const float* dy, const int32_t* argmax,
                       float* dx) {
  GPIPE_LAUNCH(MaxPoolBackwardKernel, planes * h * w, planes, h, w, kernel,
               stride, dy, argmax, dx);
}
void GlobalAvgPoolForward(int64_t planes, int64_t inner, const float* x,
                          float* y) {
  GPIPE_LAUNCH(GlobalAvgPoolForwardKernel, planes, planes, inner, x, y);
}
void GlobalAvgPoolBackward(int64_t planes, int64_t inner, const float* dy,
                           float* dx) {
  GPIPE_LAUNCH(GlobalAvgPoolBackwardKernel, planes * inner, planes, inner, dy,
               dx);
}

void BatchNormForward(int64_t batch, int64_t channels, int64_t inner,
                      bool batch_stats, bool update_running, float momentum,
                      float eps, const float* x, const float* gamma,
                      const float* beta, float* running_mean,
                      float* running_var, float* y, float* mean, float* rstd) {
  if (channels == 0) return;
  BatchNormForwardKernel<<<static_cast<int>(channels), kThreads, 0,
                           Current()>>>(
      batch, channels, inner, batch_stats, update_running, momentum, eps, x,
      gamma, beta, running_mean, running_var, y, mean, rstd);
  CheckLastError("BatchNormForwardKernel");
}
void BatchNormBackward(int64_t batch, int64_t channels, int64_t inner,
                       const float* x, const float* mean, const float* rstd,
                       const float* gamma, const float* dy, float* dx,
                       float* dgamma, float* dbeta) {
  if (channels == 0) return;
  BatchNormBackwardKernel<<<static_cast<int>(channels), kThreads, 0,
                            Current()>>>(batch, channels, inner, x, mean, rstd,
                                         gamma, dy, dx, dgamma, dbeta);
  CheckLastError("BatchNormBackwardKernel");
}

}  // namespace gpipe::cuda
