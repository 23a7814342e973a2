#include "services/tensor/threads.h"

#include <cblas.h>
#include <omp.h>

namespace gpipe {

void SetComputeThreads(int n) {
  if (n < 1) n = 1;
  // GEMMs are parallelized by our own fixed panels (cpu/gemm.cc); OpenBLAS
  // itself stays single-threaded so that results never depend on `n`.
  openblas_set_num_threads(1);
  omp_set_num_threads(n);
}

int ComputeThreads() { return omp_get_max_threads(); }

}  // namespace gpipe
