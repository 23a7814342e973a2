// Batch statistics of a step's training forwards (batch norm's per-channel
// mean and unbiased variance), held back from the running averages until
// the step ends. A training forward never reads the running averages, so
// moving them at the step's end, micro-batch by micro-batch in order, gives
// the bits that moving them inside each forward gives; and the replicas of
// a stage, each running some of the micro-batches, can then all apply every
// micro-batch's statistics in the reference trainer's order.
#ifndef GPIPE_SERVICES_NN_RUNNING_STATISTICS_H_
#define GPIPE_SERVICES_NN_RUNNING_STATISTICS_H_

#include <cstdint>
#include <map>
#include <utility>

#include "services/tensor/tensor.h"

namespace gpipe {

class RunningStatistics {
 public:
  // Keeps micro-batch `micro_batch`'s record of the layer at global index
  // `layer` (a host tensor; a second record replaces the first).
  void Record(int64_t micro_batch, int64_t layer, Tensor values);
  // The record, or null.
  const Tensor* Find(int64_t micro_batch, int64_t layer) const;
  bool empty() const { return records_.empty(); }

 private:
  std::map<std::pair<int64_t, int64_t>, Tensor> records_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_RUNNING_STATISTICS_H_
