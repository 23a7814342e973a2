// The replicas of one stage summing their gradients over links (one to
// each other replica), as worker processes do: a reduce-scatter (replica q
// receives every replica's tree nodes for slice q of each parameter, runs
// the tree on that slice) and an all-gather (each sends its summed slice to
// all). Only gradient values travel: the nodes' shapes follow from the
// groups each replica runs (ForestSpans), which every replica knows. The
// bits are the single process's (GradientTree), whatever R. Every replica
// sends to all its peers before it receives, so the links must queue two
// messages each way without a receiver (every Link here does).
//
// Buckets (StartBucket) are summed the same way, one after another on a
// thread of the reduction's own, while the stage computes the layers below:
// the sum of a parameter does not depend on which others share its
// messages, so the bits are Reduce's. Bucket b's slices travel as phases
// 4 + 2b and 5 + 2b (Reduce's are 0 and 1). GatherRows sends this
// replica's rows to every peer as kReduceRowsPhase.
#ifndef GPIPE_SERVICES_PIPELINE_LINK_REDUCTION_H_
#define GPIPE_SERVICES_PIPELINE_LINK_REDUCTION_H_

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
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

  ~LinkReduction() override;

  absl::Status Reduce(int64_t replica, int64_t step,
                      std::vector<GradientNode> forest,
                      const std::vector<NamedParameter>& params) override;
  void Close() override;
  // Every replica one group (G = R): a replica with more sums its groups'
  // tree after its last backward, and all must send the same phases.
  bool SupportsBuckets() const override;
  absl::Status StartBucket(int64_t replica, int64_t step, int64_t bucket,
                           GradientNode node,
                           std::vector<NamedParameter> params) override;
  absl::StatusOr<double> FinishBuckets() override;
  absl::StatusOr<Tensor> GatherRows(int64_t replica, int64_t step,
                                    Tensor rows) override;
  // Bytes this replica sent and received: gradients and the running
  // statistics gathered with them (for its metrics).
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }
  // Buckets summed so far (read between steps).
  int64_t buckets_summed() const { return buckets_summed_; }

 private:
  struct Bucket {
    int64_t step;
    int64_t bucket;
    GradientNode node;
    std::vector<NamedParameter> params;
  };
  // Reduce's work, its slices sent as phases `phase` and `phase` + 1.
  absl::Status Sum(int64_t step, int64_t phase,
                   std::vector<GradientNode> forest,
                   const std::vector<NamedParameter>& params);
  void RunBuckets();  // the bucket thread
  // Slice q of parameter i: elements [begin, end).
  RowRange Slice(int64_t numel, int64_t q) const;
  absl::StatusOr<Tensor> ReceiveSlice(int64_t from, int64_t step, int64_t phase,
                                      int64_t numel);

  const int64_t replica_;
  const int64_t groups_;
  const std::vector<RowRange> shares_;
  const std::vector<Link*> peers_;
  // Written by the bucket thread while it runs; read after FinishBuckets.
  int64_t bytes_sent_ = 0;
  int64_t bytes_received_ = 0;
  int64_t buckets_summed_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Bucket> buckets_;  // under mu_
  bool no_more_ = false;        // under mu_: FinishBuckets was called
  absl::Status bucket_status_;  // under mu_: the first failure
  double bucket_seconds_ = 0;   // under mu_: the step's sums, on the thread
  std::thread bucket_thread_;   // one step's buckets
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_LINK_REDUCTION_H_
