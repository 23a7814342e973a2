#include "services/tensor/cuda/cudnn_conv.h"

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <string>

#include "services/tensor/cuda/cudnn_library.h"
#include "services/tensor/cuda/runtime.h"

namespace gpipe::cuda {
namespace {

// One handle per thread, as for cuBLAS; its stream follows the thread's.
// Null when cuDNN cannot make one here.
class Handle {
 public:
  Handle() {
    if (Cudnn()->Create(&h_) != CUDNN_STATUS_SUCCESS) h_ = nullptr;
  }
  ~Handle() {
    if (h_ != nullptr) Cudnn()->Destroy(h_);
  }
  cudnnHandle_t get() {
    if (h_ == nullptr ||
        Cudnn()->SetStream(h_, static_cast<cudaStream_t>(CurrentStream())) !=
            CUDNN_STATUS_SUCCESS)
      return nullptr;
    return h_;
  }

 private:
  cudnnHandle_t h_ = nullptr;
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

// Runs one small convolution forward and backward: a machine with
// libcudnn.so.9 but without its engine libraries (or a driver it does not
// support) fails here, softly.
bool Probe(std::string* why) {
  if (Cudnn(why) == nullptr) return false;
  if (!DevicePresent()) {
    *why = "no GPU: " + DeviceDescription();
    return false;
  }
  const cpu::ConvGeometry g{2, 5, 5, 3, 1, 1};
  const size_t x_bytes = 2 * 25 * sizeof(float), w_bytes = 18 * sizeof(float);
  const size_t y_bytes = 25 * sizeof(float);
  void* x = DeviceMalloc(x_bytes);
  void* dx = DeviceMalloc(x_bytes);
  void* w = DeviceMalloc(w_bytes);
  void* dw = DeviceMalloc(w_bytes);
  void* y = DeviceMalloc(y_bytes);
  bool ok = x != nullptr && dx != nullptr && w != nullptr && dw != nullptr &&
            y != nullptr;
  if (!ok) *why = "no device memory for the cuDNN probe";
  if (ok) {
    ZeroDevice(x, x_bytes);
    ZeroDevice(w, w_bytes);
    ZeroDevice(dw, w_bytes);
    CudnnConvolution conv(g, 1, 1);
    const size_t ws_bytes = std::max<size_t>(
        {conv.forward_workspace_bytes(), conv.backward_workspace_bytes(), 4});
    void* ws = conv.ok() ? DeviceMalloc(ws_bytes) : nullptr;
    if (ws != nullptr) {
      auto f = [](void* p) { return static_cast<float*>(p); };
      conv.Forward(f(x), f(w), f(y), ws);
      conv.Backward(f(x), f(w), f(y), f(dx), f(dw), ws);
      SynchronizeStream(CurrentStream());
      DeviceFree(ws);
    }
    ok = conv.ok() && ws != nullptr;
    if (!ok)
      *why = conv.ok() ? "no device memory for the cuDNN probe" : conv.error();
  }
  for (void* p : {x, dx, w, dw, y})
    if (p != nullptr) DeviceFree(p);
  if (ok) why->clear();
  return ok;
}

}  // namespace

bool CudnnConvUsable(std::string* why) {
  static std::string reason;
  static const bool usable = Probe(&reason);
  if (why != nullptr) *why = reason;
  return usable;
}

bool CudnnConvolution::Ok(int status, const char* what) {
  if (!error_.empty()) return false;
  if (status == CUDNN_STATUS_SUCCESS) return true;
  error_ = std::string(what) + ": " +
           Cudnn()->GetErrorString(static_cast<cudnnStatus_t>(status));
  return false;
}

CudnnConvolution::CudnnConvolution(const cpu::ConvGeometry& g, int64_t batch,
                                   int64_t out_channels) {
  const CudnnLibrary& dnn = *Cudnn();
  handle_ = ThreadHandle();
  if (handle_ == nullptr) {
    error_ = "cudnnCreate failed";
    return;
  }
  cudnnHandle_t h = static_cast<cudnnHandle_t>(handle_);
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  if (!Ok(dnn.CreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor"))
    return;
  x_desc_ = x;
  if (!Ok(dnn.CreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor"))
    return;
  y_desc_ = y;
  if (!Ok(dnn.CreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor"))
    return;
  w_desc_ = w;
  if (!Ok(dnn.CreateConvolutionDescriptor(&conv),
          "cudnnCreateConvolutionDescriptor"))
    return;
  conv_desc_ = conv;
  const int s = static_cast<int>(g.stride), p = static_cast<int>(g.padding);
  const int k = static_cast<int>(g.kernel);
  Ok(dnn.SetTensor4dDescriptor(
         x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(batch),
         static_cast<int>(g.channels), static_cast<int>(g.height),
         static_cast<int>(g.width)),
     "cudnnSetTensor4dDescriptor(x)");
  Ok(dnn.SetTensor4dDescriptor(
         y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, static_cast<int>(batch),
         static_cast<int>(out_channels), static_cast<int>(g.out_height()),
         static_cast<int>(g.out_width())),
     "cudnnSetTensor4dDescriptor(y)");
  Ok(dnn.SetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
                               static_cast<int>(out_channels),
                               static_cast<int>(g.channels), k, k),
     "cudnnSetFilter4dDescriptor");
  // Cross-correlation, as im2col and PyTorch compute it.
  Ok(dnn.SetConvolution2dDescriptor(conv, p, p, s, s, 1, 1,
                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
     "cudnnSetConvolution2dDescriptor");
  Ok(dnn.SetConvolutionMathType(conv, CUDNN_FMA_MATH),
     "cudnnSetConvolutionMathType");
  if (!ok()) return;

  constexpr int kMax = 16;
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMax];
  if (Ok(dnn.GetForwardAlgorithm(h, x, w, conv, y, kMax, &n, fwd),
         "cudnnGetConvolutionForwardAlgorithm_v7"))
    forward_algo_ =
        Pick(fwd, n, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
  cudnnConvolutionBwdDataAlgoPerf_t data[kMax];
  if (Ok(dnn.GetBackwardDataAlgorithm(h, w, y, conv, x, kMax, &n, data),
         "cudnnGetConvolutionBackwardDataAlgorithm_v7"))
    data_algo_ = Pick(data, n, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
  cudnnConvolutionBwdFilterAlgoPerf_t filter[kMax];
  if (Ok(dnn.GetBackwardFilterAlgorithm(h, x, y, conv, w, kMax, &n, filter),
         "cudnnGetConvolutionBackwardFilterAlgorithm_v7"))
    filter_algo_ = Pick(filter, n, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
  if (!ok()) return;

  Ok(dnn.GetForwardWorkspaceSize(
         h, x, w, conv, y,
         static_cast<cudnnConvolutionFwdAlgo_t>(forward_algo_),
         &forward_bytes_),
     "cudnnGetConvolutionForwardWorkspaceSize");
  Ok(dnn.GetBackwardDataWorkspaceSize(
         h, w, y, conv, x,
         static_cast<cudnnConvolutionBwdDataAlgo_t>(data_algo_), &data_bytes_),
     "cudnnGetConvolutionBackwardDataWorkspaceSize");
  Ok(dnn.GetBackwardFilterWorkspaceSize(
         h, x, y, conv, w,
         static_cast<cudnnConvolutionBwdFilterAlgo_t>(filter_algo_),
         &filter_bytes_),
     "cudnnGetConvolutionBackwardFilterWorkspaceSize");
}

CudnnConvolution::~CudnnConvolution() {
  const CudnnLibrary& dnn = *Cudnn();
  if (conv_desc_ != nullptr) dnn.DestroyConvolutionDescriptor(Cd(conv_desc_));
  if (w_desc_ != nullptr) dnn.DestroyFilterDescriptor(Fd(w_desc_));
  if (y_desc_ != nullptr) dnn.DestroyTensorDescriptor(Td(y_desc_));
  if (x_desc_ != nullptr) dnn.DestroyTensorDescriptor(Td(x_desc_));
}

size_t CudnnConvolution::backward_workspace_bytes() const {
  return std::max(data_bytes_, filter_bytes_);
}

bool CudnnConvolution::OnCurrentStream() {
  if (!ok()) return false;
  // A cached convolution is reused on whatever stream the thread has now.
  handle_ = ThreadHandle();
  if (handle_ == nullptr) error_ = "cudnnSetStream failed";
  return ok();
}

void CudnnConvolution::Forward(const float* x, const float* w, float* y,
                               void* workspace) {
  if (!OnCurrentStream()) return;
  const float one = 1.0f, zero = 0.0f;
  Ok(Cudnn()->ConvolutionForward(
         static_cast<cudnnHandle_t>(handle_), &one, Td(x_desc_), x, Fd(w_desc_),
         w, Cd(conv_desc_),
         static_cast<cudnnConvolutionFwdAlgo_t>(forward_algo_), workspace,
         forward_bytes_, &zero, Td(y_desc_), y),
     "cudnnConvolutionForward");
}

void CudnnConvolution::Backward(const float* x, const float* w, const float* dy,
                                float* dx, float* dw, void* workspace) {
  if (!OnCurrentStream()) return;
  const float one = 1.0f, zero = 0.0f;
  cudnnHandle_t h = static_cast<cudnnHandle_t>(handle_);
  // The filter gradient accumulates into dw (beta = 1): after a failed data
  // gradient it must not run, or the im2col fallback the caller then takes
  // adds the same gradient into dw a second time. A null dx skips the data
  // gradient.
  if (dx != nullptr &&
      !Ok(Cudnn()->ConvolutionBackwardData(
              h, &one, Fd(w_desc_), w, Td(y_desc_), dy, Cd(conv_desc_),
              static_cast<cudnnConvolutionBwdDataAlgo_t>(data_algo_), workspace,
              data_bytes_, &zero, Td(x_desc_), dx),
          "cudnnConvolutionBackwardData")) {
    return;
  }
  if (dw == nullptr) return;  // the input gradient's half alone
  Ok(Cudnn()->ConvolutionBackwardFilter(
         h, &one, Td(x_desc_), x, Td(y_desc_), dy, Cd(conv_desc_),
         static_cast<cudnnConvolutionBwdFilterAlgo_t>(filter_algo_), workspace,
         filter_bytes_, &one, Fd(w_desc_), dw),
     "cudnnConvolutionBackwardFilter");
}

CudnnConvolution& ThreadConvolution(const cpu::ConvGeometry& g, int64_t batch,
                                    int64_t out_channels) {
  using Key = std::array<int64_t, 8>;
  // Bounded: a job has a few convolutions and batch sizes; a stream of new
  // shapes (evaluation's last partial batch, generation) starts it over.
  constexpr size_t kMaxEntries = 64;
  thread_local std::map<Key, std::unique_ptr<CudnnConvolution>> cache;
  const Key key{g.channels, g.height,  g.width, g.kernel,
                g.stride,   g.padding, batch,   out_channels};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= kMaxEntries) cache.clear();
    it = cache
             .emplace(key, std::make_unique<CudnnConvolution>(g, batch,
                                                              out_channels))
             .first;
  }
  return *it->second;
}

}  // namespace gpipe::cuda
