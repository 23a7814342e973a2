#include "services/pipeline/in_process_reduction.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"

namespace gpipe {

InProcessReduction::InProcessReduction(int64_t replicas, int64_t groups)
    : replicas_(replicas),
      groups_(groups),
      forests_(replicas),
      rows_(replicas) {}

absl::Status InProcessReduction::Arrive(std::unique_lock<std::mutex>& lock,
                                        bool committed) {
  if (closed_ && !committed)
    return absl::CancelledError("a replica of the stage failed");
  const int64_t generation = generation_;
  if (++arrived_ == replicas_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return absl::OkStatus();
  }
  cv_.wait(lock, [&] {
    return (closed_ && !committed) || generation_ != generation;
  });
  if (generation_ != generation) return absl::OkStatus();
  return absl::CancelledError("a replica of the stage failed");
}

void InProcessReduction::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

absl::Status InProcessReduction::Reduce(
    int64_t replica, int64_t step, std::vector<GradientNode> forest,
    const std::vector<NamedParameter>& params) {
  if (replica < 0 || replica >= replicas_) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica ", replica, " of ", replicas_));
  }
  for (const GradientNode& node : forest) {
    if (node.grads.size() != params.size()) {
      return absl::InternalError(absl::StrCat(
          "replica ", replica, ": a gradient node holds ", node.grads.size(),
          " tensors for ", params.size(), " parameters"));
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  forests_[replica] = std::move(forest);
  // Whatever happens next, this replica's forest is not kept past the
  // step (a later step must not see it).
  struct Forget {
    std::vector<GradientNode>& mine;
    ~Forget() { mine.clear(); }
  } forget{forests_[replica]};
  // Every replica hands in its forest before any slice is summed.
  RETURN_IF_ERROR(Arrive(lock));
  std::vector<NodeSpan> spans;
  std::vector<GradientNode*> nodes;
  for (auto& f : forests_) {
    for (GradientNode& n : f) {
      spans.push_back({n.first, n.level});
      nodes.push_back(&n);
    }
  }
  if (absl::Status s = CheckForest(spans, groups_); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("step ", step,
                     ": the replicas' gradient groups do not "
                     "form one tree: ",
                     s.message()));
  }
  const TreePlan plan = PlanTree(spans);
  // Reduce-scatter: this replica's slice of every parameter, in place.
  // The slices are disjoint, so the replicas run at once without the lock.
  lock.unlock();
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].param->grad.numel();
    RunPlanSlice(plan, nodes, i, n * replica / replicas_,
                 n * (replica + 1) / replicas_);
  }
  lock.lock();
  RETURN_IF_ERROR(Arrive(lock, /*committed=*/true));
  // All-gather: the total into this replica's gradients.
  lock.unlock();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& total = nodes[plan.result]->grads[i];
    Tensor& grad = params[i].param->grad;
    if (total.raw() != grad.raw()) grad.CopyFrom(total);
  }
  lock.lock();
  // The totals may live in another replica's forest (or gradients): nobody
  // moves on until every replica has copied.
  return Arrive(lock, /*committed=*/true);
}

absl::StatusOr<Tensor> InProcessReduction::GatherRows(int64_t replica,
                                                      int64_t step,
                                                      Tensor rows) {
  if (replica < 0 || replica >= replicas_ || !rows.defined() ||
      rows.rank() != 2 || rows.device() != Device::kCpu) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica ", replica, " of ", replicas_, ": rows to gather at step ",
        step, " must be a host matrix"));
  }
  std::unique_lock<std::mutex> lock(mu_);
  rows_[replica] = std::move(rows);
  struct Forget {
    Tensor& mine;
    ~Forget() { mine = Tensor(); }
  } forget{rows_[replica]};
  RETURN_IF_ERROR(Arrive(lock));
  const int64_t width = rows_[replica].dim(1);
  int64_t total = 0;
  absl::Status status;
  for (const Tensor& r : rows_) {
    if (r.dim(1) != width) {
      status = absl::InternalError(
          absl::StrCat("step ", step, ": the replicas gather rows of ",
                       r.dim(1), " and ", width, " values"));
    }
    total += r.dim(0);
  }
  Tensor all;
  if (status.ok()) {
    // Whatever happens, this replica reaches the barrier below: the
    // others wait there for it, past the point where Close wakes them.
    try {
      AllocatorScope scope(DefaultCpuAllocator());
      all = Tensor::Empty({total, width});
      float* at = all.f32();
      for (const Tensor& r : rows_)
        at = std::copy(r.f32(), r.f32() + r.numel(), at);
    } catch (const std::bad_alloc&) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "step ", step, ": no memory to gather the replicas' rows"));
    }
  }
  // The others read this replica's rows until each has copied.
  RETURN_IF_ERROR(Arrive(lock, /*committed=*/true));
  RETURN_IF_ERROR(status);
  return all;
}

}  // namespace gpipe
