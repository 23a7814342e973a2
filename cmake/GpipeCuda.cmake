# Decides whether the CUDA backend is built (GPIPE_CUDA=AUTO|ON|OFF) and finds
# cuBLAS and cuDNN. CUDAToolkit does not export cuDNN, so it is found by hand.
set(GPIPE_HAVE_CUDA OFF)
if(NOT GPIPE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # Stock CMake 3.25's FindCUDAToolkit marks CUDA::nvToolsExt deprecated
    # without checking that it exists, and CUDA 13 has none (NVTX is
    # header-only now): the find then fails, but only for projects that
    # require CMake 3.25 or later. Say 3.24 while it runs.
    set(gpipe_min_cmake ${CMAKE_MINIMUM_REQUIRED_VERSION})
    set(CMAKE_MINIMUM_REQUIRED_VERSION 3.24)
    find_package(CUDAToolkit QUIET)
    set(CMAKE_MINIMUM_REQUIRED_VERSION ${gpipe_min_cmake})
    find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
    find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/include)
    if(CUDAToolkit_FOUND)
      set(GPIPE_HAVE_CUDA ON)
    endif()
  endif()
  if(GPIPE_CUDA STREQUAL "ON" AND NOT GPIPE_HAVE_CUDA)
    message(FATAL_ERROR "GPIPE_CUDA=ON but no CUDA toolkit was found")
  endif()
endif()
if(GPIPE_HAVE_CUDA)
  # sm_90 code for H100/H200 and one PTX (compute_75) that the driver compiles
  # for anything else: two targets keep nvcc time small on CI's two cores.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90-real 75-virtual)
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  # No fused multiply-add: the kernels then round as the CPU's do (the CPU
  # build uses -ffp-contract=off for the same reason).
  set(CMAKE_CUDA_FLAGS_RELEASE "-O2 -DNDEBUG")
  string(APPEND CMAKE_CUDA_FLAGS " --fmad=false")
endif()
message(STATUS "gpipe: CUDA backend ${GPIPE_HAVE_CUDA}")
