#include "services/pipeline/micro_batch.h"

namespace gpipe {

std::vector<RowRange> SplitMicroBatches(int64_t n, int64_t m) {
  std::vector<RowRange> out;
  out.reserve(m);
  const int64_t base = n / m, extra = n % m;
  int64_t at = 0;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t size = base + (i < extra ? 1 : 0);
    out.push_back({at, at + size});
    at += size;
  }
  return out;
}

}  // namespace gpipe
