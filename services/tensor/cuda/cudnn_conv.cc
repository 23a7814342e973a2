#include "services/tensor/cuda/cudnn_conv.h"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "services/tensor/cuda/cudnn_library.h"
#include "services/tensor/cuda/runtime.h"

namespace gpipe::cuda {
namespace {

void Check(cudnnStatus_t s, const char* what) {
  if (s == CUDNN_STATUS_SUCCESS) return;
  std::fprintf(stderr, "cuDNN error in %s: %s\n", what,
               Cudnn()->GetErrorString(s));
  std::abort();
}

// One handle per thread, as for cuBLAS; its stream follows the thread's.
class Handle {
 public:
  Handle() { Check(Cudnn()->Create(&h_), "cudnnCreate"); }
  ~Handle() { Cudnn()->Destroy(h_); }
  cudnnHandle_t get() {
    Check(Cudnn()->SetStream(h_, static_cast<cudaStream_t>(CurrentStream())),
          "cudnnSetStream");
    return h_;
  }

 private:
  cudnnHandle_t h_;
};

cudnnHandle_t ThreadHandle() {
  thread_local Handle handle;
  return handle.get();
}

// The heuristics' first choice that is deterministic and uses no tensor
// cores (TF32 would leave fp32 rounding); `fallback` is an algorithm that
// is both for every geometry.
template <typename Perf>
int Pick(const Perf* perf, int count, int fallback) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS &&
        perf[i].determinism == CUDNN_DETERMINISTIC &&
        (perf[i].mathType == CUDNN_FMA_MATH ||
         perf[i].mathType == CUDNN_DEFAULT_MATH))
      return static_cast<int>(perf[i].algo);
  }
  return fallback;
}

cudnnTensorDescriptor_t Td(void* p) {
  return static_cast<cudnnTensorDescriptor_t>(p);
}
cudnnFilterDescriptor_t Fd(void* p) {
  return static_cast<cudnnFilterDescriptor_t>(p);
}
cudnnConvolutionDescriptor_t Cd(void* p) {
  return static_cast<cudnnConvolutionDescriptor_t>(p);
}

bool Probe(std::string* why) {
  const CudnnLibrary* dnn = Cudnn(why);
  if (dnn == nullptr) return false;
  // A workspace query loads cuDNN's engine libraries: a machine with
  // libcudnn.so.9 but not its sub-libraries fails here, softly.
  cudnnHandle_t h = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  size_t bytes = 0;
  const char* step = "cudnnCreate";
  cudnnStatus_t s = dnn->Create(&h);
  if (s == CUDNN_STATUS_SUCCESS) {
    step = "descriptors";
    s = dnn->CreateTensorDescriptor(&x);
    if (s == CUDNN_STATUS_SUCCESS) s = dnn->CreateTensorDescriptor(&y);
    if (s == CUDNN_STATUS_SUCCESS) s = dnn->CreateFilterDescriptor(&w);
    if (s == CUDNN_STATUS_SUCCESS) s = dnn->CreateConvolutionDescriptor(&conv);
  }
  if (s == CUDNN_STATUS_SUCCESS)
    s = dnn->SetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1,
                                   4, 4);
  if (s == CUDNN_STATUS_SUCCESS)
    s = dnn->SetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 1,
                                   4, 4);
  if (s == CUDNN_STATUS_SUCCESS)
    s = dnn->SetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 1, 1,
                                   3, 3);
  if (s == CUDNN_STATUS_SUCCESS)
    s = dnn->SetConvolution2dDescriptor(
        conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
  if (s == CUDNN_STATUS_SUCCESS) {
    step = "cudnnGetConvolutionForwardWorkspaceSize";
    s = dnn->GetForwardWorkspaceSize(
        h, x, w, conv, y, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
        &bytes);
  }
  if (conv != nullptr) dnn->DestroyConvolutionDescriptor(conv);
  if (w != nullptr) dnn->DestroyFilterDescriptor(w);
  if (y != nullptr) dnn->DestroyTensorDescriptor(y);
  if (x != nullptr) dnn->DestroyTensorDescriptor(x);
  if (h != nullptr) dnn->Destroy(h);
  if (s != CUDNN_STATUS_SUCCESS) {
    *why = std::string(step) + ": " + dnn->GetErrorString(s);
    return false;
  }
  why->clear();
  return true;
}

}  // namespace

bool CudnnConvUsable(std::string* why) {
  static std::string reason;
  static const bool usable = Probe(&reason);
  if (why != nullptr) *why = reason;
  return usable;
}

CudnnConvolution::CudnnConvolution(const cpu::ConvGeometry& g, int64_t batch,
                                   int64_t out_channels) {
  const CudnnLibrary& dnn = *Cudnn();
  cudnnTensorDescriptor_t x, y;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  Check(dnn.CreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
  Check(dnn.CreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
  Check(dnn.CreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
  Check(dnn.CreateConvolutionDescriptor(&conv),
        "cudnnCreateConvolutionDescriptor");
  x_desc_ = x;
  y_desc_ = y;
  w_desc_ = w;
  conv_desc_ = conv;
  const int s = static_cast<int>(g.stride), p = static_cast<int>(g.padding);
  const int k = static_cast<int>(g.kernel);
  Check(dnn.SetTensor4dDescriptor(
            x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(batch),
            static_cast<int>(g.channels), static_cast<int>(g.height),
            static_cast<int>(g.width)),
        "cudnnSetTensor4dDescriptor(x)");
  Check(dnn.SetTensor4dDescriptor(
            y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(batch),
            static_cast<int>(out_channels), static_cast<int>(g.out_height()),
            static_cast<int>(g.out_width())),
        "cudnnSetTensor4dDescriptor(y)");
  Check(dnn.SetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                                  static_cast<int>(out_channels),
                                  static_cast<int>(g.channels), k, k),
        "cudnnSetFilter4dDescriptor");
  // Cross-correlation, as im2col and PyTorch compute it.
  Check(dnn.SetConvolution2dDescriptor(
            conv, p, p, s, s, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        "cudnnSetConvolution2dDescriptor");
  Check(dnn.SetConvolutionMathType(conv, CUDNN_FMA_MATH),
        "cudnnSetConvolutionMathType");

  cudnnHandle_t h = ThreadHandle();
  constexpr int kMax = 16;
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMax];
  Check(dnn.GetForwardAlgorithm(h, x, w, conv, y, kMax, &n, fwd),
        "cudnnGetConvolutionForwardAlgorithm_v7");
  forward_algo_ =
      Pick(fwd, n, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
  cudnnConvolutionBwdDataAlgoPerf_t data[kMax];
  Check(dnn.GetBackwardDataAlgorithm(h, w, y, conv, x, kMax, &n, data),
        "cudnnGetConvolutionBackwardDataAlgorithm_v7");
  data_algo_ = Pick(data, n, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
  cudnnConvolutionBwdFilterAlgoPerf_t filter[kMax];
  Check(dnn.GetBackwardFilterAlgorithm(h, x, y, conv, w, kMax, &n, filter),
        "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
  filter_algo_ = Pick(filter, n, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);

  Check(dnn.GetForwardWorkspaceSize(
            h, x, w, conv, y,
            static_cast<cudnnConvolutionFwdAlgo_t>(forward_algo_),
            &forward_bytes_),
        "cudnnGetConvolutionForwardWorkspaceSize");
  Check(
      dnn.GetBackwardDataWorkspaceSize(
          h, w, y, conv, x,
          static_cast<cudnnConvolutionBwdDataAlgo_t>(data_algo_), &data_bytes_),
      "cudnnGetConvolutionBackwardDataWorkspaceSize");
  Check(dnn.GetBackwardFilterWorkspaceSize(
            h, x, y, conv, w,
            static_cast<cudnnConvolutionBwdFilterAlgo_t>(filter_algo_),
            &filter_bytes_),
        "cudnnGetConvolutionBackwardFilterWorkspaceSize");
}

CudnnConvolution::~CudnnConvolution() {
  const CudnnLibrary& dnn = *Cudnn();
  dnn.DestroyConvolutionDescriptor(Cd(conv_desc_));
  dnn.DestroyFilterDescriptor(Fd(w_desc_));
  dnn.DestroyTensorDescriptor(Td(y_desc_));
  dnn.DestroyTensorDescriptor(Td(x_desc_));
}

size_t CudnnConvolution::backward_workspace_bytes() const {
  return std::max(data_bytes_, filter_bytes_);
}

void CudnnConvolution::Forward(const float* x, const float* w, float* y,
                               void* workspace) {
  const float one = 1.0f, zero = 0.0f;
  Check(
      Cudnn()->ConvolutionForward(
          ThreadHandle(), &one, Td(x_desc_), x, Fd(w_desc_), w, Cd(conv_desc_),
          static_cast<cudnnConvolutionFwdAlgo_t>(forward_algo_), workspace,
          forward_bytes_, &zero, Td(y_desc_), y),
      "cudnnConvolutionForward");
}

void CudnnConvolution::Backward(const float* x, const float* w, const float* dy,
                                float* dx, float* dw, void* workspace) {
  const float one = 1.0f, zero = 0.0f;
  cudnnHandle_t h = ThreadHandle();
  Check(Cudnn()->ConvolutionBackwardData(
            h, &one, Fd(w_desc_), w, Td(y_desc_), dy, Cd(conv_desc_),
            static_cast<cudnnConvolutionBwdDataAlgo_t>(data_algo_), workspace,
            data_bytes_, &zero, Td(x_desc_), dx),
        "cudnnConvolutionBackwardData");
  Check(Cudnn()->ConvolutionBackwardFilter(
            h, &one, Td(x_desc_), x, Td(y_desc_), dy, Cd(conv_desc_),
            static_cast<cudnnConvolutionBwdFilterAlgo_t>(filter_algo_),
            workspace, filter_bytes_, &one, Fd(w_desc_), dw),
        "cudnnConvolutionBackwardFilter");
}

}  // namespace gpipe::cuda
