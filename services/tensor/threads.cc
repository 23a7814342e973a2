#include "services/tensor/threads.h"

#include <cblas.h>
#include <omp.h>

#include "services/tensor/denormals.h"

namespace gpipe {

void SetComputeThreads(int n) {
  if (n < 1) n = 1;
  // GEMMs are parallelized by our own fixed panels (cpu/gemm.cc); OpenBLAS
  // itself stays single-threaded so that results never depend on `n`.
  openblas_set_num_threads(1);
  omp_set_num_threads(n);
  FlushDenormalsOnThisThread();
  // The team's threads normally inherited the mode from the thread that
  // made them; this covers a pool made before it was set.
#pragma omp parallel num_threads(n)
  FlushDenormalsOnThisThread();
}

int ComputeThreads() { return omp_get_max_threads(); }

const char* BlasCoreName() {
  const char* name = openblas_get_corename();
  return name != nullptr ? name : "unknown";
}

}  // namespace gpipe
