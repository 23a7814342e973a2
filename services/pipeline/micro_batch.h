// Splitting a mini-batch into micro-batches (GPipe's M).
#ifndef GPIPE_SERVICES_PIPELINE_MICRO_BATCH_H_
#define GPIPE_SERVICES_PIPELINE_MICRO_BATCH_H_

#include <cstdint>
#include <vector>

namespace gpipe {

struct RowRange {
  int64_t begin;
  int64_t end;
};

// Splits `n` rows into `m` contiguous ranges whose sizes differ by at most
// one, larger ones first (10 into 4: 3, 3, 2, 2). Requires 1 <= m <= n.
std::vector<RowRange> SplitMicroBatches(int64_t n, int64_t m);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_MICRO_BATCH_H_
