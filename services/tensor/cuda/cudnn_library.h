// cuDNN 9, opened with dlopen when first asked for. It is optional: its
// engine libraries are hundreds of megabytes that a GPU machine may lack
// (and that bench/device_pack.sh cannot carry), so our own im2col + cuBLAS
// convolution is the path that always works and cuDNN only accelerates it.
// Only the legacy convolution API is resolved.
#ifndef GPIPE_SERVICES_TENSOR_CUDA_CUDNN_LIBRARY_H_
#define GPIPE_SERVICES_TENSOR_CUDA_CUDNN_LIBRARY_H_

#include <cudnn.h>

#include <string>

namespace gpipe::cuda {

struct CudnnLibrary {
  decltype(&cudnnGetVersion) GetVersion;
  decltype(&cudnnGetErrorString) GetErrorString;
  decltype(&cudnnCreate) Create;
  decltype(&cudnnDestroy) Destroy;
  decltype(&cudnnSetStream) SetStream;
  decltype(&cudnnCreateTensorDescriptor) CreateTensorDescriptor;
  decltype(&cudnnSetTensor4dDescriptor) SetTensor4dDescriptor;
  decltype(&cudnnDestroyTensorDescriptor) DestroyTensorDescriptor;
  decltype(&cudnnCreateFilterDescriptor) CreateFilterDescriptor;
  decltype(&cudnnSetFilter4dDescriptor) SetFilter4dDescriptor;
  decltype(&cudnnDestroyFilterDescriptor) DestroyFilterDescriptor;
  decltype(&cudnnCreateConvolutionDescriptor) CreateConvolutionDescriptor;
  decltype(&cudnnSetConvolution2dDescriptor) SetConvolution2dDescriptor;
  decltype(&cudnnSetConvolutionMathType) SetConvolutionMathType;
  decltype(&cudnnDestroyConvolutionDescriptor) DestroyConvolutionDescriptor;
  decltype(&cudnnGetConvolutionForwardAlgorithm_v7) GetForwardAlgorithm;
  decltype(&cudnnGetConvolutionForwardWorkspaceSize) GetForwardWorkspaceSize;
  decltype(&cudnnConvolutionForward) ConvolutionForward;
  decltype(&cudnnGetConvolutionBackwardDataAlgorithm_v7)
      GetBackwardDataAlgorithm;
  decltype(&cudnnGetConvolutionBackwardDataWorkspaceSize)
      GetBackwardDataWorkspaceSize;
  decltype(&cudnnConvolutionBackwardData) ConvolutionBackwardData;
  decltype(&cudnnGetConvolutionBackwardFilterAlgorithm_v7)
      GetBackwardFilterAlgorithm;
  decltype(&cudnnGetConvolutionBackwardFilterWorkspaceSize)
      GetBackwardFilterWorkspaceSize;
  decltype(&cudnnConvolutionBackwardFilter) ConvolutionBackwardFilter;
};

// The process's cuDNN, or null when it cannot be opened or lacks a symbol;
// `why` (if given) then says what was missing. Decided once.
const CudnnLibrary* Cudnn(std::string* why = nullptr);

}  // namespace gpipe::cuda

#endif  // GPIPE_SERVICES_TENSOR_CUDA_CUDNN_LIBRARY_H_
