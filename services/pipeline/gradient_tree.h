// The fixed order in which a step's gradients add up across micro-batch
// groups, so that data-parallel replicas give the same bits whatever their
// number.
//
// A step's M micro-batches form G groups of M / G consecutive ones. Within
// a group the layers accumulate each micro-batch's gradient into
// Parameter::grad in micro-batch order, as always. Across groups the sums
// meet in a pairwise tree over group indices: groups 2i and 2i+1 first,
// then those pairs, and so on; what is left (G not a power of two) adds
// left to right. A replica that runs a contiguous run of groups sums the
// aligned subtrees inside its run (its forest); feeding every replica's
// forest, in group order, through the same tree gives exactly the single
// process's additions, because IEEE addition is commutative and each
// addition has the same two operands. The result depends on G, not on how
// the groups are shared out.
#ifndef GPIPE_SERVICES_PIPELINE_GRADIENT_TREE_H_
#define GPIPE_SERVICES_PIPELINE_GRADIENT_TREE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "services/nn/model.h"
#include "services/pipeline/micro_batch.h"
#include "services/tensor/tensor.h"

namespace gpipe {

// The groups [begin, end) that replica `replica` of `replicas` runs, and
// the micro-batches they are when M micro-batches form `groups` groups:
// contiguous runs as even as whole groups allow (G / R each when R divides
// G; otherwise some replicas run one group more, which the tree's bits do
// not see). Require 1 <= replicas <= groups (and groups | M).
RowRange ReplicaGroups(int64_t groups, int64_t replicas, int64_t replica);
RowRange ReplicaMicroBatches(int64_t micro_batches, int64_t groups,
                             int64_t replicas, int64_t replica);

// The sum of the groups [first, first + 2^level): one gradient per
// parameter, in the model's parameter order.
struct GradientNode {
  int64_t first = 0;
  int64_t level = 0;
  std::vector<Tensor> grads;

  int64_t end() const { return first + (int64_t{1} << level); }
};

// The additions that sum nodes given in group order, as index pairs into
// that list: `into` += `from`, in order; the total ends in node `result`
// (-1 for no nodes). Adjacent siblings (equal levels, the left one aligned
// to twice its size) merge as soon as both are there; the nodes left over
// add left to right. Pure, so every replica derives the same plan.
struct TreePlan {
  struct Add {
    int into;
    int from;
  };
  std::vector<Add> adds;
  int result = -1;
};
struct NodeSpan {
  int64_t first;
  int64_t level;
};
TreePlan PlanTree(const std::vector<NodeSpan>& nodes);

// The nodes GradientTree holds after pushing groups [begin, end): the
// largest aligned runs, left to right. Every replica can so tell the shape
// of every other's forest from the groups it runs.
std::vector<NodeSpan> ForestSpans(int64_t begin, int64_t end);

// INVALID_ARGUMENT unless the nodes tile [0, groups) in order, each aligned
// to its size: what any plan over them assumes.
absl::Status CheckForest(const std::vector<NodeSpan>& nodes, int64_t groups);

// One replica's side of a step: after the last micro-batch of each of its
// groups, Push takes the parameters' gradients (and zeroes them for the
// next group), merging siblings at once so that at most log2(groups) + 1
// nodes are held.
class GradientTree {
 public:
  // Group `group`'s gradients, from `params` (which are then zeroed). Groups
  // must come in order without gaps.
  absl::Status Push(int64_t group, const std::vector<NamedParameter>& params);
  // The nodes held, in group order; the tree is empty afterwards.
  std::vector<GradientNode> TakeForest();
  bool empty() const { return stack_.empty(); }

 private:
  std::vector<GradientNode> stack_;
  int64_t next_ = -1;
};

// Runs `plan` on elements [begin, end) of parameter `param` of `nodes`
// (in place: the nodes' buffers are scratch). Slices are independent, so
// replicas may each run a slice of the same nodes at once.
void RunPlanSlice(const TreePlan& plan, std::vector<GradientNode*>& nodes,
                  size_t param, int64_t begin, int64_t end);

// The whole sum of `forest` (one replica's, covering every group) into
// `params`' gradients: a single process's last step.
absl::Status FoldInto(std::vector<GradientNode> forest, int64_t groups,
                      const std::vector<NamedParameter>& params);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_GRADIENT_TREE_H_
