// The replicas of one stage summing their gradients over links (one to
// each other replica), as worker processes do: a reduce-scatter (replica q
// receives every replica's tree nodes for slice q of each parameter, runs
// the tree on that slice) and an all-gather (each sends its summed slice to
// all). Only gradient values travel: the nodes' shapes follow from the
// groups each replica runs (ForestSpans), which every replica knows. The
// bits are the single process's (GradientTree), whatever R. Every replica
// sends to all its peers before it receives, so the links must queue two
// messages each way without a receiver (every Link here does).
#ifndef GPIPE_SERVICES_PIPELINE_LINK_REDUCTION_H_
#define GPIPE_SERVICES_PIPELINE_LINK_REDUCTION_H_

#include <vector>

#include "services/pipeline/gradient_reducer.h"
#include "services/pipeline/micro_batch.h"
#include "services/transport/link.h"

namespace gpipe {

class LinkReduction final : public GradientReducer {
 public:
  // This is replica `replica`; replica q runs gradient groups `shares[q]`
  // (contiguous, in order, together [0, groups)) and `peers[q]` is the link
  // to it (null for this replica). Links are not owned.
  LinkReduction(int64_t replica, int64_t groups, std::vector<RowRange> shares,
                std::vector<Link*> peers);

  absl::Status Reduce(int64_t replica, int64_t step,
                      std::vector<GradientNode> forest,
                      const std::vector<NamedParameter>& params) override;
  void Close() override;
  // Gradient bytes this replica sent and received (for its metrics).
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

 private:
  // Slice q of parameter i: elements [begin, end).
  RowRange Slice(int64_t numel, int64_t q) const;
  absl::StatusOr<Tensor> ReceiveSlice(int64_t from, int64_t step, int64_t phase,
                                      int64_t numel);

  const int64_t replica_;
  const int64_t groups_;
  const std::vector<RowRange> shares_;
  const std::vector<Link*> peers_;
  int64_t bytes_sent_ = 0;
  int64_t bytes_received_ = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_LINK_REDUCTION_H_
