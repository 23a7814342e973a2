#include "services/pipeline/gradient_tree.h"

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/tensor/ops.h"

namespace gpipe {
namespace {

// Whether `left` and `right` are the two halves of one node of the tree.
bool Siblings(const NodeSpan& left, const NodeSpan& right) {
  return left.level == right.level &&
         left.first + (int64_t{1} << left.level) == right.first &&
         left.first % (int64_t{2} << left.level) == 0;
}

}  // namespace

RowRange ReplicaGroups(int64_t groups, int64_t replicas, int64_t replica) {
  return RowRange{groups * replica / replicas,
                  groups * (replica + 1) / replicas};
}

RowRange ReplicaMicroBatches(int64_t micro_batches, int64_t groups,
                             int64_t replicas, int64_t replica) {
  const int64_t per_group = micro_batches / groups;
  const RowRange g = ReplicaGroups(groups, replicas, replica);
  return RowRange{g.begin * per_group, g.end * per_group};
}

TreePlan PlanTree(const std::vector<NodeSpan>& nodes) {
  TreePlan plan;
  std::vector<NodeSpan> span = nodes;
  std::vector<int> stack;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    int cur = i;
    while (!stack.empty() && Siblings(span[stack.back()], span[cur])) {
      const int left = stack.back();
      stack.pop_back();
      plan.adds.push_back({left, cur});
      ++span[left].level;
      cur = left;
    }
    stack.push_back(cur);
  }
  if (stack.empty()) return plan;
  plan.result = stack[0];
  for (size_t j = 1; j < stack.size(); ++j)
    plan.adds.push_back({stack[0], stack[j]});
  return plan;
}

std::vector<NodeSpan> ForestSpans(int64_t begin, int64_t end) {
  std::vector<NodeSpan> out;
  for (int64_t at = begin; at < end;) {
    int64_t level = 0;
    while (at % (int64_t{2} << level) == 0 && at + (int64_t{2} << level) <= end)
      ++level;
    out.push_back({at, level});
    at += int64_t{1} << level;
  }
  return out;
}

absl::Status CheckForest(const std::vector<NodeSpan>& nodes, int64_t groups) {
  int64_t next = 0;
  for (const NodeSpan& n : nodes) {
    if (n.level < 0 || n.level > 40 || n.first != next ||
        n.first % (int64_t{1} << n.level) != 0 ||
        n.first + (int64_t{1} << n.level) > groups) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient groups: a node of level ", n.level,
                       " at group ", n.first, " does not continue the tree of ",
                       groups, " groups at group ", next));
    }
    next = n.first + (int64_t{1} << n.level);
  }
  if (next != groups) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient groups: the nodes cover groups [0, ", next, ") of ", groups));
  }
  return absl::OkStatus();
}

absl::Status GradientTree::Push(int64_t group,
                                const std::vector<NamedParameter>& params) {
  if (next_ >= 0 && group != next_) {
    return absl::FailedPreconditionError(
        absl::StrCat("gradient group ", group, " arrived where group ", next_,
                     " was due: the weight gradients ran out of order"));
  }
  next_ = group + 1;
  GradientNode node;
  node.first = group;
  node.grads.reserve(params.size());
  for (const NamedParameter& p : params) {
    node.grads.push_back(p.param->grad.Clone());
    p.param->grad.SetZero();
  }
  while (!stack_.empty() && Siblings({stack_.back().first, stack_.back().level},
                                     {node.first, node.level})) {
    GradientNode left = std::move(stack_.back());
    stack_.pop_back();
    for (size_t i = 0; i < left.grads.size(); ++i) {
      Tensor& into = left.grads[i];
      ops::AddInPlace(into.device(), into.numel(), node.grads[i].f32(),
                      into.f32());
    }
    ++left.level;
    node = std::move(left);
  }
  stack_.push_back(std::move(node));
  return absl::OkStatus();
}

std::vector<GradientNode> GradientTree::TakeForest() {
  std::vector<GradientNode> out = std::move(stack_);
  stack_.clear();
  next_ = -1;
  return out;
}

void RunPlanSlice(const TreePlan& plan, std::vector<GradientNode*>& nodes,
                  size_t param, int64_t begin, int64_t end) {
  if (end <= begin) return;
  for (const TreePlan::Add& add : plan.adds) {
    Tensor& into = nodes[add.into]->grads[param];
    const Tensor& from = nodes[add.from]->grads[param];
    ops::AddInPlace(into.device(), end - begin, from.f32() + begin,
                    into.f32() + begin);
  }
}

absl::Status FoldInto(std::vector<GradientNode> forest, int64_t groups,
                      const std::vector<NamedParameter>& params) {
  std::vector<NodeSpan> spans;
  std::vector<GradientNode*> nodes;
  for (GradientNode& n : forest) {
    if (n.grads.size() != params.size()) {
      return absl::InternalError(absl::StrCat("gradient groups: a node holds ",
                                              n.grads.size(), " gradients for ",
                                              params.size(), " parameters"));
    }
    spans.push_back({n.first, n.level});
    nodes.push_back(&n);
  }
  RETURN_IF_ERROR(CheckForest(spans, groups));
  const TreePlan plan = PlanTree(spans);
  for (size_t i = 0; i < params.size(); ++i) {
    RunPlanSlice(plan, nodes, i, 0, params[i].param->grad.numel());
    params[i].param->grad.CopyFrom(nodes[plan.result]->grads[i]);
  }
  return absl::OkStatus();
}

}  // namespace gpipe
