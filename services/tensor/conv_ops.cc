// ops::Conv2dForward / Conv2dBackward (ops.h): im2col and GEMMs, sample by
// sample on the CPU (the order the bitwise contracts were written against)
// and a chunk of samples at a time on the GPU (our kernels and cuBLAS), or
// cuDNN on the GPU.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "services/tensor/conv_chunk.h"
#include "services/tensor/cpu/conv.h"
#include "services/tensor/cpu/elementwise.h"
#include "services/tensor/cpu/gemm.h"
#include "services/tensor/cpu/reduce.h"
#include "services/tensor/cpu/shallow_product.h"
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

// Threads to share `tasks` between: none beyond the one running when
// called inside a parallel region (its GEMMs then run on one too).
int TaskThreads(int64_t tasks) {
  return static_cast<int>(
      std::clamp<int64_t>(omp_in_parallel() ? 1 : omp_get_max_threads(), 1,
                          std::max<int64_t>(tasks, 1)));
}

// `a` (rows x cols) transposed into `t` (cols x rows).
void Transpose(int64_t rows, int64_t cols, const float* a, float* t) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
}

// Sample by sample: each sample's columns (channels x k^2 rows of its
// output positions) stay in cache from im2col to the GEMM, and the GEMM
// writes the sample's [Cout, HW] output in place. Columns of many samples
// side by side in one GEMM (as the GPU does) left a transposing copy of the
// whole output and columns too large for the cache. Each element is the
// same chain of fused multiply-adds either way; samples share out between
// threads, and each GEMM inside runs on one.
void CpuForward(const cpu::ConvGeometry& g, int64_t batch, int64_t cout,
                const float* x, const float* weight, const float* bias,
                float* y) {
  const int64_t hw = g.out_positions(), ckk = g.column_rows();
  const int64_t in_size = g.input_size();
  const int threads = TaskThreads(batch);
  // A shallow product (a first layer's few taps) adds the bias as it
  // stores each element, the same add the pass over y after the GEMM makes.
  const bool shallow = cpu::ShallowDepth(ckk);
  Tensor columns = Tensor::Empty({threads, ckk * hw});
  float* const col_base = columns.f32();
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
  for (int64_t b = 0; b < batch; ++b) {
    float* const col = col_base + omp_get_thread_num() * ckk * hw;
    cpu::Im2Col(g, x + b * in_size, col, hw);
    float* const yb = y + b * cout * hw;
    if (shallow) {
      cpu::ShallowProduct(cout, hw, ckk, weight, col, hw, bias, yb, hw);
    } else {
      cpu::GemmStrided(false, false, cout, hw, ckk, 1.0f, weight, ckk, col, hw,
                       0.0f, yb, hw);
    }
  }
  if (bias != nullptr && !shallow)
    cpu::AddChannelBias(batch, cout, hw, bias, y);
}

// dX for samples first, first + step, ... : each sample's column gradients
// (W^T dY, read straight from dY's [Cout, HW] rows) stay in cache in `dcol`
// for col2im, as the forward's columns do.
void InputGradientOfSamples(const cpu::ConvGeometry& g, int64_t batch,
                            int64_t cout, const float* weight, const float* dy,
                            float* dx, int64_t first, int64_t step,
                            float* dcol) {
  const int64_t hw = g.out_positions(), ckk = g.column_rows();
  const int64_t in_size = g.input_size();
  for (int64_t b = first; b < batch; b += step) {
    cpu::GemmStrided(true, false, ckk, hw, cout, 1.0f, weight, ckk,
                     dy + b * cout * hw, hw, 0.0f, dcol, hw);
    float* const dxb = dx + b * in_size;
    std::fill_n(dxb, in_size, 0.0f);
    cpu::Col2Im(g, dcol, hw, dxb);
  }
}

// Whether the weight gradient runs as its transpose, dW^T += col dY^T: the
// product is small (cout x ckk) over a long depth, and its transpose fills
// the GEMM's register tiles better where it does (the first layer's 16 x 9
// ran at a third of the speed its transpose does), for the same bits. A
// few taps (a first layer's) go to the direct kernel, which makes the
// transpose too.
bool TransposedWeightGradient(int64_t cout, int64_t ckk) {
  return ckk <= cpu::kShallowGradientTaps ||
         cpu::TransposeFillsTilesBetter(cout, ckk);
}

// CpuWeightGradient's scratch, made before any parallel region it runs in:
// the columns are a tensor, counted against the memory budget, and making
// one past the budget or in a cancelled step throws, which must not happen
// on an OpenMP thread (std::terminate).
struct WeightGradientScratch {
  WeightGradientScratch(const cpu::ConvGeometry& g, int64_t cout)
      : columns(Tensor::Empty({g.column_rows() * g.out_positions()})),
        transposed(TransposedWeightGradient(cout, g.column_rows())
                       ? cout * g.column_rows()
                       : 0) {}
  Tensor columns;  // one sample's im2col
  // dW^T, the weight's size, where TransposedWeightGradient; else empty.
  std::vector<float> transposed;
};

// dW += dY col^T over the batch, each element one chain over the samples'
// output positions in order: sample by sample, so the columns stay in cache
// and dY is read in place. The samples cannot share out between threads
// (their terms chain in order), and one sample's product is too small for
// the GEMM to share out: on several threads this half runs on one.
void CpuWeightGradient(const cpu::ConvGeometry& g, int64_t batch, int64_t cout,
                       const float* x, const float* dy, float* dweight,
                       WeightGradientScratch& scratch) {
  const int64_t hw = g.out_positions(), ckk = g.column_rows();
  const int64_t in_size = g.input_size();
  const bool transposed = !scratch.transposed.empty();
  float* const dweight_t = scratch.transposed.data();
  if (transposed) Transpose(cout, ckk, dweight, dweight_t);
  float* const col = scratch.columns.f32();
  for (int64_t b = 0; b < batch; ++b) {
    cpu::Im2Col(g, x + b * in_size, col, hw);
    const float* const dyb = dy + b * cout * hw;
    // The direct kernel where it runs (a few taps, AVX-512), else the GEMM.
    if (transposed &&
        cpu::ShallowWeightGradient(ckk, cout, hw, col, dyb, hw, dweight_t)) {
      continue;
    }
    if (transposed) {
      cpu::GemmStrided(false, true, ckk, cout, hw, 1.0f, col, hw, dyb, hw, 1.0f,
                       dweight_t, cout);
    } else {
      cpu::GemmStrided(false, true, cout, ckk, hw, 1.0f, dyb, hw, col, hw, 1.0f,
                       dweight, ckk);
    }
  }
  if (transposed) Transpose(ckk, cout, dweight_t, dweight);
}

// The input gradient's samples share out between threads. The weight
// gradient's cannot, so with both to make, one thread makes it while the
// others make the input gradient; each element is computed as on one thread.
// A team may come smaller than asked (OMP_DYNAMIC, a thread limit): the
// shares follow the team the region got.
void CpuBackward(const cpu::ConvGeometry& g, int64_t batch, int64_t cout,
                 const float* x, const float* weight, const float* dy,
                 float* dx, float* dweight, float* dbias) {
  const int64_t hw = g.out_positions(), ckk = g.column_rows();
  std::optional<WeightGradientScratch> scratch;
  if (dx == nullptr && dweight != nullptr && dbias != nullptr &&
      ckk <= cpu::kShallowGradientTaps && TaskThreads(2) > 1) {
    // A first layer's few taps: their weight gradient runs on one thread
    // (a larger one's GEMMs would share out), so the bias gradient runs
    // beside it rather than before it. A one-thread team runs both.
    scratch.emplace(g, cout);
#pragma omp parallel sections num_threads(2)
    {
#pragma omp section
      CpuWeightGradient(g, batch, cout, x, dy, dweight, *scratch);
#pragma omp section
      cpu::SumChannelsInto(batch, cout, hw, dy, dbias);
    }
    return;
  }
  if (dbias != nullptr) cpu::SumChannelsInto(batch, cout, hw, dy, dbias);
  if (dx == nullptr) {
    if (dweight != nullptr) {
      scratch.emplace(g, cout);
      CpuWeightGradient(g, batch, cout, x, dy, dweight, *scratch);
    }
    return;
  }
  // The samples, and the weight gradient as one task more.
  const int threads = TaskThreads(batch + (dweight != nullptr ? 1 : 0));
  bool weight_done = false;
  {
    // Columns for the input gradient's threads (a team smaller than asked
    // needs no more), let go of before a weight gradient after the region,
    // which makes its own.
    const int for_dx = threads - (dweight != nullptr && threads > 1 ? 1 : 0);
    Tensor columns = Tensor::Empty({for_dx, ckk * hw});
    float* const dcol = columns.f32();
    if (dweight != nullptr && threads > 1) scratch.emplace(g, cout);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      const int team = omp_get_num_threads();
      // The weight gradient's thread, when it has one of its own.
      const int apart = scratch.has_value() && team > 1 ? 1 : 0;
      const int t = omp_get_thread_num() - apart;
      if (t < 0) {
        CpuWeightGradient(g, batch, cout, x, dy, dweight, *scratch);
        weight_done = true;
      } else {
        InputGradientOfSamples(g, batch, cout, weight, dy, dx, t, team - apart,
                               dcol + t * ckk * hw);
      }
    }
  }
  if (dweight != nullptr && !weight_done) {
    if (!scratch.has_value()) scratch.emplace(g, cout);
    CpuWeightGradient(g, batch, cout, x, dy, dweight, *scratch);
  }
}

#if GPIPE_HAVE_CUDA
// Samples per im2col chunk on the GPU (conv_chunk.h).
int64_t ChunkSize(const cpu::ConvGeometry& g, int64_t batch) {
  return ConvChunkSamples(kGpuColumnFloats, g.column_rows() * g.out_positions(),
                          batch);
}

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
    const int64_t chunk = ChunkSize(g, batch);
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
  const int64_t chunk = ChunkSize(g, batch);
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
