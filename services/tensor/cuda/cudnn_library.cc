#include "services/tensor/cuda/cudnn_library.h"

#include <dlfcn.h>

#include <optional>

#ifndef GPIPE_CUDNN_SONAME
#define GPIPE_CUDNN_SONAME "libcudnn.so.9"
#endif

namespace gpipe::cuda {
namespace {

struct Opened {
  std::optional<CudnnLibrary> library;
  std::string why;
};

template <typename F>
bool Resolve(void* lib, const char* name, F* f, std::string* why) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
  if (*f == nullptr && why->empty())
    *why = std::string(GPIPE_CUDNN_SONAME) + " lacks " + name;
  return *f != nullptr;
}

Opened Open() {
  Opened out;
  void* lib = dlopen(GPIPE_CUDNN_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    out.why = std::string("cannot open ") + GPIPE_CUDNN_SONAME + ": " +
              (err != nullptr ? err : "unknown error");
    return out;
  }
  CudnnLibrary c;
  std::string* why = &out.why;
  bool ok = true;
  ok &= Resolve(lib, "cudnnGetVersion", &c.GetVersion, why);
  ok &= Resolve(lib, "cudnnGetErrorString", &c.GetErrorString, why);
  ok &= Resolve(lib, "cudnnCreate", &c.Create, why);
  ok &= Resolve(lib, "cudnnDestroy", &c.Destroy, why);
  ok &= Resolve(lib, "cudnnSetStream", &c.SetStream, why);
  ok &= Resolve(lib, "cudnnCreateTensorDescriptor", &c.CreateTensorDescriptor,
                why);
  ok &=
      Resolve(lib, "cudnnSetTensor4dDescriptor", &c.SetTensor4dDescriptor, why);
  ok &= Resolve(lib, "cudnnDestroyTensorDescriptor", &c.DestroyTensorDescriptor,
                why);
  ok &= Resolve(lib, "cudnnCreateFilterDescriptor", &c.CreateFilterDescriptor,
                why);
  ok &=
      Resolve(lib, "cudnnSetFilter4dDescriptor", &c.SetFilter4dDescriptor, why);
  ok &= Resolve(lib, "cudnnDestroyFilterDescriptor", &c.DestroyFilterDescriptor,
                why);
  ok &= Resolve(lib, "cudnnCreateConvolutionDescriptor",
                &c.CreateConvolutionDescriptor, why);
  ok &= Resolve(lib, "cudnnSetConvolution2dDescriptor",
                &c.SetConvolution2dDescriptor, why);
  ok &= Resolve(lib, "cudnnSetConvolutionMathType", &c.SetConvolutionMathType,
                why);
  ok &= Resolve(lib, "cudnnDestroyConvolutionDescriptor",
                &c.DestroyConvolutionDescriptor, why);
  ok &= Resolve(lib, "cudnnGetConvolutionForwardAlgorithm_v7",
                &c.GetForwardAlgorithm, why);
  ok &= Resolve(lib, "cudnnGetConvolutionForwardWorkspaceSize",
                &c.GetForwardWorkspaceSize, why);
  ok &= Resolve(lib, "cudnnConvolutionForward", &c.ConvolutionForward, why);
  ok &= Resolve(lib, "cudnnGetConvolutionBackwardDataAlgorithm_v7",
                &c.GetBackwardDataAlgorithm, why);
  ok &= Resolve(lib, "cudnnGetConvolutionBackwardDataWorkspaceSize",
                &c.GetBackwardDataWorkspaceSize, why);
  ok &= Resolve(lib, "cudnnConvolutionBackwardData", &c.ConvolutionBackwardData,
                why);
  ok &= Resolve(lib, "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                &c.GetBackwardFilterAlgorithm, why);
  ok &= Resolve(lib, "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                &c.GetBackwardFilterWorkspaceSize, why);
  ok &= Resolve(lib, "cudnnConvolutionBackwardFilter",
                &c.ConvolutionBackwardFilter, why);
  if (!ok) {
    dlclose(lib);
    return out;
  }
  out.library = c;  // the library stays open for the life of the process
  return out;
}

}  // namespace

const CudnnLibrary* Cudnn(std::string* why) {
  static const Opened opened = Open();
  if (why != nullptr) *why = opened.why;
  return opened.library ? &*opened.library : nullptr;
}

}  // namespace gpipe::cuda
