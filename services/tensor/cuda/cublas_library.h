// cuBLAS, opened with dlopen at the first GEMM rather than linked. Linked,
// libcublasLt's ~94 KB of thread-local storage becomes part of every
// thread's static TLS at start-up, and threads created with small stacks
// (civetweb's 100 KB, under the Prometheus exposer) then fail with EINVAL.
// Opened later, its TLS is allocated per thread on demand. Also lets
// binaries built with CUDA start on machines without cuBLAS.
#ifndef GPIPE_SERVICES_TENSOR_CUDA_CUBLAS_LIBRARY_H_
#define GPIPE_SERVICES_TENSOR_CUDA_CUBLAS_LIBRARY_H_

#include <cublas_v2.h>

namespace gpipe::cuda {

struct CublasLibrary {
  decltype(&cublasGetStatusString) GetStatusString;
  decltype(&cublasCreate_v2) Create;
  decltype(&cublasDestroy_v2) Destroy;
  decltype(&cublasSetMathMode) SetMathMode;
  decltype(&cublasSetStream_v2) SetStream;
  decltype(&cublasSetWorkspace_v2) SetWorkspace;
  decltype(&cublasSgemm_v2) Sgemm;
  decltype(&cublasSgemmStridedBatched) SgemmStridedBatched;
  // Spelled out: C++ sees an overload of cublasGemmEx (cublas_api.h's
  // wrapper for the old compute-type argument), so decltype cannot pick.
  cublasStatus_t (*GemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                           int, int, int, const void*, const void*,
                           cudaDataType, int, const void*, cudaDataType, int,
                           const void*, void*, cudaDataType, int,
                           cublasComputeType_t, cublasGemmAlgo_t);
};

// The process's cuBLAS; aborts naming the library when it cannot be opened
// (only reached once a tensor is on a GPU, which needs cuBLAS).
const CublasLibrary& Cublas();

}  // namespace gpipe::cuda

#endif  // GPIPE_SERVICES_TENSOR_CUDA_CUBLAS_LIBRARY_H_
