#include "services/nn/running_statistics.h"

namespace gpipe {

void RunningStatistics::Record(int64_t micro_batch, int64_t layer,
                               Tensor values) {
  records_[{micro_batch, layer}] = std::move(values);
}

const Tensor* RunningStatistics::Find(int64_t micro_batch,
                                      int64_t layer) const {
  auto it = records_.find({micro_batch, layer});
  return it == records_.end() ? nullptr : &it->second;
}

}  // namespace gpipe
