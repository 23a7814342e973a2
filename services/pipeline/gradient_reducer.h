// How the replicas of one stage sum their gradients after a step's last
// backward: each hands in its forest (GradientTree) and receives the
// tree's total in its parameters' gradients, the same bits on every
// replica. In one process the replicas meet in memory
// (InProcessReduction); between processes a transport carries the
// forests' slices.
#ifndef GPIPE_SERVICES_PIPELINE_GRADIENT_REDUCER_H_
#define GPIPE_SERVICES_PIPELINE_GRADIENT_REDUCER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "services/nn/model.h"
#include "services/pipeline/gradient_tree.h"

namespace gpipe {

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // Blocks until every replica of the stage has handed in step `step`'s
  // forest; then `params`' gradients hold the sum over all G groups. The
  // forest's nodes may share storage with `params`' gradients.
  virtual absl::Status Reduce(int64_t replica, int64_t step,
                              std::vector<GradientNode> forest,
                              const std::vector<NamedParameter>& params) = 0;
  // Wakes every replica waiting in Reduce with CANCELLED (a replica
  // failed), now and for every later call.
  virtual void Close() = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_GRADIENT_REDUCER_H_
