#include "services/tensor/cuda/cublas_library.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#ifndef GPIPE_CUBLAS_SONAME
#define GPIPE_CUBLAS_SONAME "libcublas.so"
#endif

namespace gpipe::cuda {
namespace {

template <typename F>
void Resolve(void* lib, const char* name, F* f) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
  if (*f == nullptr) {
    std::fprintf(stderr, "cuBLAS: %s lacks %s\n", GPIPE_CUBLAS_SONAME, name);
    std::abort();
  }
}

CublasLibrary Open() {
  void* lib = dlopen(GPIPE_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("libcublas.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "cuBLAS: cannot open %s: %s\n", GPIPE_CUBLAS_SONAME,
                 dlerror());
    std::abort();
  }
  CublasLibrary c;
  Resolve(lib, "cublasGetStatusString", &c.GetStatusString);
  Resolve(lib, "cublasCreate_v2", &c.Create);
  Resolve(lib, "cublasDestroy_v2", &c.Destroy);
  Resolve(lib, "cublasSetMathMode", &c.SetMathMode);
  Resolve(lib, "cublasSetStream_v2", &c.SetStream);
  Resolve(lib, "cublasSetWorkspace_v2", &c.SetWorkspace);
  Resolve(lib, "cublasSgemm_v2", &c.Sgemm);
  Resolve(lib, "cublasSgemmStridedBatched", &c.SgemmStridedBatched);
  Resolve(lib, "cublasGemmEx", &c.GemmEx);
  return c;  // the library stays open for the life of the process
}

}  // namespace

const CublasLibrary& Cublas() {
  static const CublasLibrary library = Open();
  return library;
}

}  // namespace gpipe::cuda
