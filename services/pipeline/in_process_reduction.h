// The replicas of one stage, as threads of one process, summing their
// gradients in memory: a reduce-scatter (replica r runs the tree on the
// r-th slice of every parameter, in place in the forests) and an
// all-gather (each replica copies the total), between barriers.
#ifndef GPIPE_SERVICES_PIPELINE_IN_PROCESS_REDUCTION_H_
#define GPIPE_SERVICES_PIPELINE_IN_PROCESS_REDUCTION_H_

#include <condition_variable>
#include <mutex>

#include "services/pipeline/gradient_reducer.h"

namespace gpipe {

class InProcessReduction final : public GradientReducer {
 public:
  InProcessReduction(int64_t replicas, int64_t groups);

  absl::Status Reduce(int64_t replica, int64_t step,
                      std::vector<GradientNode> forest,
                      const std::vector<NamedParameter>& params) override;
  absl::StatusOr<Tensor> GatherRows(int64_t replica, int64_t step,
                                    Tensor rows) override;
  void Close() override;

 private:
  // Waits until all replicas have arrived at the current barrier; CANCELLED
  // once closed, unless `committed`: past the first barrier every replica
  // is working on the others' forests and reaches the next barriers
  // whatever happens, so none may leave early and free its forest.
  absl::Status Arrive(std::unique_lock<std::mutex>& lock,
                      bool committed = false);

  const int64_t replicas_;
  const int64_t groups_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  int64_t arrived_ = 0;
  int64_t generation_ = 0;  // barriers passed
  // Per replica: its forest (kept alive until every replica has copied).
  std::vector<std::vector<GradientNode>> forests_;
  // Per replica: its rows in GatherRows (kept until every replica copied).
  std::vector<Tensor> rows_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_IN_PROCESS_REDUCTION_H_
