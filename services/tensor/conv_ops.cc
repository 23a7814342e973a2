// ops::Conv2dForward / Conv2dBackward (ops.h): im2col and one GEMM per chunk
// of samples, on the CPU (the order the bitwise contracts were written
// against) or the GPU (our kernels and cuBLAS), or cuDNN on the GPU.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "services/tensor/conv_chunk.h"
#include "services/tensor/cpu/conv.h"
#include "services/tensor/cpu/elementwise.h"
#include "services/tensor/cpu/gemm.h"
#include "services/tensor/cpu/reduce.h"
#include "services/tensor/fake_device.h"
#include "services/tensor/ops.h"
#include "services/tensor/tensor.h"

#if GPIPE_HAVE_CUDA
#include "services/tensor/cuda/cnn_kernels.h"
#include "services/tensor/cuda/kernels.h"
#include "services/tensor/cuda/runtime.h"
#endif
#if GPIPE_HAVE_CUDNN
#include "services/tensor/cuda/cudnn_conv.h"
#include "services/tensor/cuda/cudnn_library.h"
#endif

namespace gpipe::ops {
namespace {

// Samples per im2col chunk (conv_chunk.h).
int64_t ChunkSize(Device d, const cpu::ConvGeometry& g, int64_t batch) {
  return ConvChunkSamples(
      d == Device::kCuda ? kGpuColumnFloats : kCpuColumnFloats,
      g.channels * g.kernel * g.kernel * g.out_height() * g.out_width(), batch);
}

void CpuForward(const cpu::ConvGeometry& g, int64_t batch, int64_t cout,
                const float* x, const float* weight, const float* bias,
                float* y) {
  const int64_t hw = g.out_height() * g.out_width();
  const int64_t ckk = g.channels * g.kernel * g.kernel;
  const int64_t in_size = g.channels * g.height * g.width;
  const int64_t chunk = ChunkSize(Device::kCpu, g, batch);
  Tensor col = Tensor::Empty({ckk, chunk * hw});
  Tensor out = Tensor::Empty({cout, chunk * hw});
  for (int64_t b0 = 0; b0 < batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, batch - b0), ld = nb * hw;
#pragma omp parallel for if (nb > 1)
    for (int64_t i = 0; i < nb; ++i)
      cpu::Im2Col(g, x + (b0 + i) * in_size, col.f32() + i * hw, ld);
    cpu::Gemm(false, false, cout, ld, ckk, 1.0f, weight, col.f32(), 0.0f,
              out.f32());
    // [Cout, nb*HW] -> [nb, Cout, HW]
#pragma omp parallel for if (nb > 1)
    for (int64_t i = 0; i < nb; ++i)
      for (int64_t c = 0; c < cout; ++c)
        std::copy_n(out.f32() + c * ld + i * hw, hw,
                    y + ((b0 + i) * cout + c) * hw);
  }
  if (bias != nullptr) cpu::AddChannelBias(batch, cout, hw, bias, y);
}

void CpuBackward(const cpu::ConvGeometry& g, int64_t batch, int64_t cout,
                 const float* x, const float* weight, const float* dy,
                 float* dx, float* dweight, float* dbias) {
  const int64_t hw = g.out_height() * g.out_width();
  const int64_t ckk = g.channels * g.kernel * g.kernel;
  const int64_t in_size = g.channels * g.height * g.width;
  const int64_t chunk = ChunkSize(Device::kCpu, g, batch);
  if (dbias != nullptr) cpu::SumChannelsInto(batch, cout, hw, dy, dbias);
  if (dx != nullptr) std::fill_n(dx, batch * in_size, 0.0f);
  if (dx == nullptr && dweight == nullptr) return;
  Tensor col = dweight != nullptr ? Tensor::Empty({ckk, chunk * hw}) : Tensor();
  Tensor dcol = dx != nullptr ? Tensor::Empty({ckk, chunk * hw}) : Tensor();
  Tensor dout = Tensor::Empty({cout, chunk * hw});
  for (int64_t b0 = 0; b0 < batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, batch - b0), ld = nb * hw;
#pragma omp parallel for if (nb > 1)
    for (int64_t i = 0; i < nb; ++i) {
      if (dweight != nullptr)
        cpu::Im2Col(g, x + (b0 + i) * in_size, col.f32() + i * hw, ld);
      for (int64_t c = 0; c < cout; ++c)
        std::copy_n(dy + ((b0 + i) * cout + c) * hw, hw,
                    dout.f32() + c * ld + i * hw);
    }
    // dW += dY col^T; dcol = W^T dY.
    if (dweight != nullptr) {
      cpu::GemmStrided(false, true, cout, ckk, ld, 1.0f, dout.f32(), ld,
                       col.f32(), ld, 1.0f, dweight, ckk);
    }
    if (dx == nullptr) continue;
    cpu::GemmStrided(true, false, ckk, ld, cout, 1.0f, weight, ckk, dout.f32(),
                     ld, 0.0f, dcol.f32(), ld);
#pragma omp parallel for if (nb > 1)
    for (int64_t i = 0; i < nb; ++i)
      cpu::Col2Im(g, dcol.f32() + i * hw, ld, dx + (b0 + i) * in_size);
  }
}

#if GPIPE_HAVE_CUDA
Tensor DeviceScratch(int64_t floats) {
  return Tensor::Empty({std::max<int64_t>(floats, 1)}, DType::kF32,
                       Device::kCuda);
}

bool UseCudnn(ConvPath path) {
#if GPIPE_HAVE_CUDNN
  if (path == ConvPath::kIm2Col) return false;
  if (path == ConvPath::kCudnn) return CudnnUsable();
  return CudnnSelected();
#else
  return false;
#endif
}

// cuDNN's convolution; false (and a note on stderr, once) when a call
// failed, and the caller computes it with im2col instead. cuDNN reports bad
// arguments and missing engines before it launches anything, so a failed
// call has not touched its outputs (dweight included).
bool CudnnFailed(const std::string& error) {
  static std::once_flag noted;
  std::call_once(noted, [&] {
    std::fprintf(stderr, "cuDNN convolution failed (%s); using im2col\n",
                 error.c_str());
  });
  return false;
}

bool CudnnForward(const cpu::ConvGeometry& g, int64_t batch, int64_t cout,
                  const float* x, const float* weight, float* y) {
#if GPIPE_HAVE_CUDNN
  cuda::CudnnConvolution& conv = cuda::ThreadConvolution(g, batch, cout);
  if (!conv.ok()) return CudnnFailed(conv.error());
  Tensor ws = DeviceScratch((conv.forward_workspace_bytes() + 3) / 4);
  conv.Forward(x, weight, y, ws.raw());
  return conv.ok() || CudnnFailed(conv.error());
#else
  return false;
#endif
}

bool CudnnBackward(const cpu::ConvGeometry& g, int64_t batch, int64_t cout,
                   const float* x, const float* weight, const float* dy,
                   float* dx, float* dweight) {
#if GPIPE_HAVE_CUDNN
  cuda::CudnnConvolution& conv = cuda::ThreadConvolution(g, batch, cout);
  if (!conv.ok()) return CudnnFailed(conv.error());
  Tensor ws = DeviceScratch((conv.backward_workspace_bytes() + 3) / 4);
  conv.Backward(x, weight, dy, dx, dweight, ws.raw());
  return conv.ok() || CudnnFailed(conv.error());
#else
  return false;
#endif
}

void CudaForward(const cpu::ConvGeometry& g, int64_t batch, int64_t cout,
                 const float* x, const float* weight, const float* bias,
                 float* y, ConvPath path) {
  const int64_t hw = g.out_height() * g.out_width();
  if (!UseCudnn(path) || !CudnnForward(g, batch, cout, x, weight, y)) {
    const int64_t ckk = g.channels * g.kernel * g.kernel;
    const int64_t in_size = g.channels * g.height * g.width;
    const int64_t chunk = ChunkSize(Device::kCuda, g, batch);
    Tensor col = DeviceScratch(ckk * chunk * hw);
    Tensor out = DeviceScratch(cout * chunk * hw);
    for (int64_t b0 = 0; b0 < batch; b0 += chunk) {
      const int64_t nb = std::min(chunk, batch - b0), ld = nb * hw;
      cuda::Im2ColBatch(g, nb, x + b0 * in_size, col.f32());
      Gemm(Device::kCuda, false, false, cout, ld, ckk, 1.0f, weight, col.f32(),
           0.0f, out.f32());
      cuda::ChunkToNchw(nb, cout, hw, out.f32(), y + b0 * cout * hw);
    }
  }
  if (bias != nullptr) cuda::AddChannelBias(batch, cout, hw, bias, y);
}

void CudaBackward(const cpu::ConvGeometry& g, int64_t batch, int64_t cout,
                  const float* x, const float* weight, const float* dy,
                  float* dx, float* dweight, float* dbias, ConvPath path) {
  const int64_t hw = g.out_height() * g.out_width();
  const int64_t in_size = g.channels * g.height * g.width;
  if (dbias != nullptr) {
    Tensor planes = DeviceScratch(batch * cout);
    cuda::SumChannelsInto(batch, cout, hw, dy, dbias, planes.f32());
  }
  if (UseCudnn(path) &&
      CudnnBackward(g, batch, cout, x, weight, dy, dx, dweight))
    return;
  const int64_t ckk = g.channels * g.kernel * g.kernel;
  const int64_t chunk = ChunkSize(Device::kCuda, g, batch);
  if (dx != nullptr) cuda::ZeroDevice(dx, batch * in_size * sizeof(float));
  if (dx == nullptr && dweight == nullptr) return;
  Tensor col = dweight != nullptr ? DeviceScratch(ckk * chunk * hw) : Tensor();
  Tensor dcol = dx != nullptr ? DeviceScratch(ckk * chunk * hw) : Tensor();
  Tensor dout = DeviceScratch(cout * chunk * hw);
  for (int64_t b0 = 0; b0 < batch; b0 += chunk) {
    const int64_t nb = std::min(chunk, batch - b0), ld = nb * hw;
    cuda::NchwToChunk(nb, cout, hw, dy + b0 * cout * hw, dout.f32());
    if (dweight != nullptr) {
      cuda::Im2ColBatch(g, nb, x + b0 * in_size, col.f32());
      Gemm(Device::kCuda, false, true, cout, ckk, ld, 1.0f, dout.f32(),
           col.f32(), 1.0f, dweight);
    }
    if (dx == nullptr) continue;
    Gemm(Device::kCuda, true, false, ckk, ld, cout, 1.0f, weight, dout.f32(),
         0.0f, dcol.f32());
    cuda::Col2ImBatch(g, nb, dcol.f32(), dx + b0 * in_size);
  }
}
#endif

}  // namespace

bool CudnnUsable() {
#if GPIPE_HAVE_CUDNN
  return cuda::CudnnConvUsable();
#else
  return false;
#endif
}

bool CudnnSelected() {
#if GPIPE_HAVE_CUDNN
  static const bool selected = [] {
    const char* env = std::getenv("GPIPE_CUDNN");
    if (env != nullptr && std::string(env) == "0") return false;
    return cuda::CudnnConvUsable();
  }();
  return selected;
#else
  return false;
#endif
}

std::string CudnnDescription() {
#if GPIPE_HAVE_CUDNN
  const char* env = std::getenv("GPIPE_CUDNN");
  if (env != nullptr && std::string(env) == "0") return "off (GPIPE_CUDNN=0)";
  std::string why;
  if (!cuda::CudnnConvUsable(&why)) return "unavailable: " + why;
  const size_t v = cuda::Cudnn()->GetVersion();
  return "cuDNN " + std::to_string(v / 10000) + "." +
         std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
#else
  return "unavailable: built without cuDNN's headers";
#endif
}

void Conv2dForward(Device d, const cpu::ConvGeometry& g, int64_t batch,
                   int64_t out_channels, const float* x, const float* weight,
                   const float* bias, float* y, ConvPath path) {
  // The fake device (fake_device.h) runs the CPU's im2col, on its memory.
  const FakeDeviceAccess fake_access(d == Device::kCuda);
  if (d == Device::kCuda && !fake_access.active()) {
#if GPIPE_HAVE_CUDA
    CudaForward(g, batch, out_channels, x, weight, bias, y, path);
    return;
#else
    std::fprintf(stderr, "Conv2dForward: CUDA tensor without CUDA\n");
    std::abort();
#endif
  }
  CpuForward(g, batch, out_channels, x, weight, bias, y);
}

void Conv2dBackward(Device d, const cpu::ConvGeometry& g, int64_t batch,
                    int64_t out_channels, const float* x, const float* weight,
                    const float* dy, float* dx, float* dweight, float* dbias,
                    ConvPath path) {
  const FakeDeviceAccess fake_access(d == Device::kCuda);
  if (d == Device::kCuda && !fake_access.active()) {
#if GPIPE_HAVE_CUDA
    CudaBackward(g, batch, out_channels, x, weight, dy, dx, dweight, dbias,
                 path);
    return;
#else
    std::fprintf(stderr, "Conv2dBackward: CUDA tensor without CUDA\n");
    std::abort();
#endif
  }
  CpuBackward(g, batch, out_channels, x, weight, dy, dx, dweight, dbias);
}

}  // namespace gpipe::ops
