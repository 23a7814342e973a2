// How the replicas of one stage sum their gradients after a step's last
// backward: each hands in its forest (GradientTree) and receives the
// tree's total in its parameters' gradients, the same bits on every
// replica; then they gather what else every micro-batch produced. In one
// process the replicas meet in memory (InProcessReduction); between processes a
// transport carries the forests' slices.
#ifndef GPIPE_SERVICES_PIPELINE_GRADIENT_REDUCER_H_
#define GPIPE_SERVICES_PIPELINE_GRADIENT_REDUCER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
  // Every replica's `rows` (a host [n, width] tensor: one row per
  // micro-batch it ran, in order), stacked in replica order: the step's M
  // rows in micro-batch order, the same on every replica. Batch norm's
  // statistics travel so (RunningStatistics): each replica then moves its
  // running averages by every micro-batch, as the reference trainer does.
  // Called after Reduce (or FinishBuckets) of the same step.
  virtual absl::StatusOr<Tensor> GatherRows(int64_t replica, int64_t step,
                                            Tensor rows) = 0;
  // Wakes every replica waiting in Reduce with CANCELLED (a replica
  // failed), now and for every later call.
  virtual void Close() = 0;

  // Overlap with the drain (optional): a replica that runs one gradient
  // group hands in its step's parameters in buckets as the last backward
  // finishes them, `node` holding the bucket's gradients (level 0, first =
  // the replica's group), numbered from 0 in the same order on every
  // replica; each is summed like Reduce while the caller computes on, and
  // FinishBuckets waits for every one of them: the seconds their sums took
  // (not the compute they overlapped), or the first error.
  virtual bool SupportsBuckets() const { return false; }
  virtual absl::Status StartBucket(int64_t replica, int64_t step,
                                   int64_t bucket, GradientNode node,
                                   std::vector<NamedParameter> params) {
    return absl::UnimplementedError("this reduction takes no buckets");
  }
  virtual absl::StatusOr<double> FinishBuckets() {
    return absl::UnimplementedError("this reduction takes no buckets");
  }
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_GRADIENT_REDUCER_H_
