#include "services/tensor/cuda/cudnn_library.h"

#include <dlfcn.h>

#include <iterator>
#include <optional>
#include <type_traits>

#ifndef GPIPE_CUDNN_SONAME
#define GPIPE_CUDNN_SONAME "libcudnn.so.9"
#endif

namespace gpipe::cuda {
namespace {

struct Opened {
  std::optional<CudnnLibrary> library;
  std::string why;
};

// One entry per CudnnLibrary member: the symbol's name and how to store
// what dlsym found for it. The members have as many types as there are
// entries, so each entry carries its own typed store.
struct Symbol {
  const char* name;
  void (*store)(CudnnLibrary& library, void* address);
};

template <auto kMember>
void Store(CudnnLibrary& library, void* address) {
  using F = std::remove_reference_t<decltype(library.*kMember)>;
  library.*kMember = reinterpret_cast<F>(address);
}

constexpr Symbol kSymbols[] = {
    {"cudnnGetVersion", &Store<&CudnnLibrary::GetVersion>},
    {"cudnnGetErrorString", &Store<&CudnnLibrary::GetErrorString>},
    {"cudnnCreate", &Store<&CudnnLibrary::Create>},
    {"cudnnDestroy", &Store<&CudnnLibrary::Destroy>},
    {"cudnnSetStream", &Store<&CudnnLibrary::SetStream>},
    {"cudnnCreateTensorDescriptor",
     &Store<&CudnnLibrary::CreateTensorDescriptor>},
    {"cudnnSetTensor4dDescriptor",
     &Store<&CudnnLibrary::SetTensor4dDescriptor>},
    {"cudnnDestroyTensorDescriptor",
     &Store<&CudnnLibrary::DestroyTensorDescriptor>},
    {"cudnnCreateFilterDescriptor",
     &Store<&CudnnLibrary::CreateFilterDescriptor>},
    {"cudnnSetFilter4dDescriptor",
     &Store<&CudnnLibrary::SetFilter4dDescriptor>},
    {"cudnnDestroyFilterDescriptor",
     &Store<&CudnnLibrary::DestroyFilterDescriptor>},
    {"cudnnCreateConvolutionDescriptor",
     &Store<&CudnnLibrary::CreateConvolutionDescriptor>},
    {"cudnnSetConvolution2dDescriptor",
     &Store<&CudnnLibrary::SetConvolution2dDescriptor>},
    {"cudnnSetConvolutionMathType",
     &Store<&CudnnLibrary::SetConvolutionMathType>},
    {"cudnnDestroyConvolutionDescriptor",
     &Store<&CudnnLibrary::DestroyConvolutionDescriptor>},
    {"cudnnGetConvolutionForwardAlgorithm_v7",
     &Store<&CudnnLibrary::GetForwardAlgorithm>},
    {"cudnnGetConvolutionForwardWorkspaceSize",
     &Store<&CudnnLibrary::GetForwardWorkspaceSize>},
    {"cudnnConvolutionForward", &Store<&CudnnLibrary::ConvolutionForward>},
    {"cudnnGetConvolutionBackwardDataAlgorithm_v7",
     &Store<&CudnnLibrary::GetBackwardDataAlgorithm>},
    {"cudnnGetConvolutionBackwardDataWorkspaceSize",
     &Store<&CudnnLibrary::GetBackwardDataWorkspaceSize>},
    {"cudnnConvolutionBackwardData",
     &Store<&CudnnLibrary::ConvolutionBackwardData>},
    {"cudnnGetConvolutionBackwardFilterAlgorithm_v7",
     &Store<&CudnnLibrary::GetBackwardFilterAlgorithm>},
    {"cudnnGetConvolutionBackwardFilterWorkspaceSize",
     &Store<&CudnnLibrary::GetBackwardFilterWorkspaceSize>},
    {"cudnnConvolutionBackwardFilter",
     &Store<&CudnnLibrary::ConvolutionBackwardFilter>},
};

// Every member is in the table once (a member left out would stay
// uninitialized and be called through).
static_assert(sizeof(CudnnLibrary) == std::size(kSymbols) * sizeof(void*));

Opened Open() {
  Opened out;
  void* lib = dlopen(GPIPE_CUDNN_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* err = dlerror();
    out.why = std::string("cannot open ") + GPIPE_CUDNN_SONAME + ": " +
              (err != nullptr ? err : "unknown error");
    return out;
  }
  CudnnLibrary c{};
  for (const Symbol& symbol : kSymbols) {
    void* address = dlsym(lib, symbol.name);
    if (address == nullptr) {
      out.why = std::string(GPIPE_CUDNN_SONAME) + " lacks " + symbol.name;
      dlclose(lib);
      return out;
    }
    symbol.store(c, address);
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
