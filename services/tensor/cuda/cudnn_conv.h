// 2-D convolution through cuDNN's legacy API (cudnn_library.h), fp32 with
// FMA math only (no TF32) and deterministic algorithms, so a run is
// reproducible and stays within fp32 rounding of the im2col path. Device
// pointers, NCHW, weights [Cout, Cin, k, k]; queued on the thread's current
// stream.
#ifndef GPIPE_SERVICES_TENSOR_CUDA_CUDNN_CONV_H_
#define GPIPE_SERVICES_TENSOR_CUDA_CUDNN_CONV_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "services/tensor/cpu/conv.h"

namespace gpipe::cuda {

// Whether cuDNN opens and runs a convolution query on this machine; `why`
// says why not. Decided once per process (needs a GPU).
bool CudnnConvUsable(std::string* why = nullptr);

// One convolution's descriptors and chosen algorithms for a batch. A failed
// cuDNN call is remembered, not fatal: later calls do nothing and ok() turns
// false, so the caller can compute the convolution another way.
class CudnnConvolution {
 public:
  CudnnConvolution(const cpu::ConvGeometry& g, int64_t batch,
                   int64_t out_channels);
  ~CudnnConvolution();
  CudnnConvolution(const CudnnConvolution&) = delete;
  CudnnConvolution& operator=(const CudnnConvolution&) = delete;

  bool ok() const { return error_.empty(); }
  // The first failed call and cuDNN's message.
  const std::string& error() const { return error_; }

  // Workspace for the forward, or for both backward calls.
  size_t forward_workspace_bytes() const { return forward_bytes_; }
  size_t backward_workspace_bytes() const;

  // y = conv(x, w).
  void Forward(const float* x, const float* w, float* y, void* workspace);
  // dx = the input gradient (overwritten); dw += the weight gradient. A
  // null dx or dw skips that half.
  void Backward(const float* x, const float* w, const float* dy, float* dx,
                float* dw, void* workspace);

 private:
  // Points the thread's handle at its current stream; false once anything
  // has failed.
  bool OnCurrentStream();
  // Records the first failure; false once anything has failed.
  bool Ok(int status, const char* what);

  void* handle_ = nullptr;  // the thread's cudnnHandle_t
  void* x_desc_ = nullptr;  // cudnnTensorDescriptor_t
  void* y_desc_ = nullptr;
  void* w_desc_ = nullptr;     // cudnnFilterDescriptor_t
  void* conv_desc_ = nullptr;  // cudnnConvolutionDescriptor_t
  int forward_algo_ = 0, data_algo_ = 0, filter_algo_ = 0;
  size_t forward_bytes_ = 0, data_bytes_ = 0, filter_bytes_ = 0;
  std::string error_;
};

// The calling thread's convolution for this geometry, batch and output
// channel count, made at its first use and kept: building descriptors and
// asking the heuristics for algorithms cost milliseconds, more than a small
// convolution. A small per-thread cache, like the thread's cuDNN handle;
// one that failed stays failed (its callers take im2col).
CudnnConvolution& ThreadConvolution(const cpu::ConvGeometry& g, int64_t batch,
                                    int64_t out_channels);

}  // namespace gpipe::cuda

#endif  // GPIPE_SERVICES_TENSOR_CUDA_CUDNN_CONV_H_
