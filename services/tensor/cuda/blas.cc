#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "services/tensor/cuda/cublas_library.h"
#include "services/tensor/cuda/kernels.h"
#include "services/tensor/cuda/runtime.h"

namespace gpipe::cuda {
namespace {

void Check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "cuBLAS error in %s: %s\n", what,
               Cublas().GetStatusString(s));
  std::abort();
}

// One handle per thread (a cuBLAS handle must not be shared between threads
// that use it at once); its stream follows the thread's current stream.
//
// cuBLAS promises bitwise the same results run after run only while one
// stream is active, unless each stream has a workspace of its own: with the
// default pool, concurrent streams (the stages of an in-process pipeline)
// may make it choose other internal implementations. So every (thread,
// stream) gets its own workspace, set after every cublasSetStream (which
// resets it to the pool). 32 MiB is what NVIDIA recommends for Hopper
// (4 MiB for earlier GPUs).
class Handle {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  Handle() {
    Check(Cublas().Create(&h_), "cublasCreate");
    // Plain fp32 products: TF32 would leave fp32 rounding of the CPU's.
    Check(Cublas().SetMathMode(h_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }
  ~Handle() {
    Cublas().Destroy(h_);
    // Errors ignored: at thread or process exit the context may be gone.
    for (auto& [stream, workspace] : workspaces_) cudaFree(workspace);
    cudaGetLastError();
  }
  cublasHandle_t get() {
    void* stream = CurrentStream();
    if (stream != stream_ || workspaces_.empty()) {
      Check(Cublas().SetStream(h_, static_cast<cudaStream_t>(stream)),
            "cublasSetStream");
      void*& workspace = workspaces_[stream];
      if (workspace == nullptr) workspace = DeviceMalloc(kWorkspaceBytes);
      if (workspace == nullptr) {
        std::fprintf(stderr, "cuBLAS: no device memory for a workspace\n");
        std::abort();
      }
      Check(Cublas().SetWorkspace(h_, workspace, kWorkspaceBytes),
            "cublasSetWorkspace");
      stream_ = stream;
    }
    return h_;
  }

 private:
  cublasHandle_t h_;
  void* stream_ = nullptr;
  // A workspace is used only by work on its own stream, so a thread that
  // moves between streams never has two streams' GEMMs share one.
  std::map<void*, void*> workspaces_;
};

cublasHandle_t ThreadHandle() {
  thread_local Handle handle;
  return handle.get();
}

}  // namespace

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so the
// operands swap places and keep their transposition flags.
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
          float alpha, const float* a, const float* b, float beta, float* c) {
  if (m == 0 || n == 0) return;
  const int lda = trans_a ? m : k, ldb = trans_b ? k : n;
  Check(Cublas().Sgemm(ThreadHandle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                       trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                       ldb, a, lda, &beta, c, n),
        "cublasSgemm");
}

void GemmBf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
              float alpha, const uint16_t* a, const uint16_t* b, float beta,
              float* c) {
  if (m == 0 || n == 0) return;
  const int lda = trans_a ? m : k, ldb = trans_b ? k : n;
  Check(Cublas().GemmEx(ThreadHandle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                        trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                        CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda, &beta, c,
                        CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx(bf16)");
}

void GemmStridedBatched(bool trans_a, bool trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, const float* a,
                        int64_t stride_a, const float* b, int64_t stride_b,
                        float beta, float* c, int64_t stride_c, int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  const int lda = trans_a ? m : k, ldb = trans_b ? k : n;
  Check(Cublas().SgemmStridedBatched(
            ThreadHandle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
            trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb,
            stride_b, a, lda, stride_a, &beta, c, n, stride_c, batch),
        "cublasSgemmStridedBatched");
}

}  // namespace gpipe::cuda
