#include "services/tensor/threads.h"

#include <cblas.h>
#include <omp.h>

namespace gpipe {

void SetComputeThreads(int n) {
  if (n < 1) n = 1;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int ComputeThreads() { return omp_get_max_threads(); }

}  // namespace gpipe
