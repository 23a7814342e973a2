#include "services/tensor/threads.h"

#include <omp.h>

#include "services/tensor/denormals.h"

namespace gpipe {

void SetComputeThreads(int n) {
  if (n < 1) n = 1;
  omp_set_num_threads(n);
  FlushDenormalsOnThisThread();
  // The team's threads normally inherited the mode from the thread that
  // made them; this covers a pool made before it was set.
#pragma omp parallel num_threads(n)
  FlushDenormalsOnThisThread();
}

int ComputeThreads() { return omp_get_max_threads(); }

}  // namespace gpipe
