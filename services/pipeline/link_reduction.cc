#include "services/pipeline/link_reduction.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/tensor/threads.h"

namespace gpipe {

namespace {

// `work`'s status, or an error for what it threw (an allocation failing on a
// thread of the reduction's own must fail the step, not end the process).
absl::Status Guarded(const std::function<absl::Status()>& work) {
  try {
    return work();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "out of memory while summing gradients with the other replicas");
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("summing gradients with the other replicas: ", e.what()));
  }
}

// Sends on a thread of its own while the caller receives: every replica
// sends to all its peers before it receives, and a link that holds less
// than a message (a shared-memory ring smaller than a stage's gradient)
// would otherwise leave both ends of a pair blocked in Send. Abandoned (the
// caller returned early on a receive error), it closes the reduction's
// links, which ends a blocked Send, and joins.
class ConcurrentSends {
 public:
  ConcurrentSends(LinkReduction* reduction, std::function<absl::Status()> work)
      : reduction_(reduction),
        thread_([this, work = std::move(work)] { status_ = Guarded(work); }) {}
  ~ConcurrentSends() {
    if (thread_.joinable()) {
      reduction_->Close();
      thread_.join();
    }
  }
  absl::Status Join() {
    thread_.join();
    return status_;
  }

 private:
  LinkReduction* reduction_;
  absl::Status status_;
  std::thread thread_;
};

}  // namespace

LinkReduction::LinkReduction(int64_t replica, int64_t groups,
                             std::vector<RowRange> shares,
                             std::vector<Link*> peers)
    : replica_(replica),
      groups_(groups),
      shares_(std::move(shares)),
      peers_(std::move(peers)) {}

LinkReduction::~LinkReduction() {
  if (bucket_thread_.joinable()) {
    Close();  // a bucket thread blocked on a peer wakes with an error
    (void)FinishBuckets();
  }
}

bool LinkReduction::SupportsBuckets() const {
  return std::all_of(shares_.begin(), shares_.end(),
                     [](const RowRange& s) { return s.end - s.begin == 1; });
}

void LinkReduction::Close() {
  for (Link* link : peers_)
    if (link != nullptr) link->Close();
}

absl::Status LinkReduction::StartBucket(int64_t replica, int64_t step,
                                        int64_t bucket, GradientNode node,
                                        std::vector<NamedParameter> params) {
  if (replica != replica_ || bucket < 0 ||
      shares_[replica_].end - shares_[replica_].begin != 1 ||
      node.first != shares_[replica_].begin || node.level != 0 ||
      node.grads.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica ", replica, ": bucket ", bucket,
        " is not one gradient group of replica ", replica_, "'s share"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  buckets_.push_back({step, bucket, std::move(node), std::move(params)});
  if (!bucket_thread_.joinable()) {
    no_more_ = false;
    bucket_seconds_ = 0;
    // The caller's compute threads: a new thread would get OpenMP's
    // default, every core, for the tree's additions.
    const int threads = ComputeThreads();
    try {
      bucket_thread_ = std::thread([this, threads] {
        SetComputeThreads(threads);
        RunBuckets();
      });
    } catch (const std::system_error& e) {
      buckets_.clear();
      return absl::ResourceExhaustedError(
          absl::StrCat("no thread to sum gradient buckets: ", e.what()));
    }
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void LinkReduction::RunBuckets() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !buckets_.empty() || no_more_; });
    if (buckets_.empty()) return;
    Bucket b = std::move(buckets_.front());
    buckets_.pop_front();
    if (!bucket_status_.ok()) continue;  // a failed step sums nothing more
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = Guarded([&] {
      std::vector<GradientNode> forest;
      forest.push_back(std::move(b.node));
      return Sum(b.step, 4 + 2 * b.bucket, std::move(forest), b.params);
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    lock.lock();
    bucket_seconds_ += seconds;
    if (s.ok()) ++buckets_summed_;
    if (!s.ok() && bucket_status_.ok()) bucket_status_ = std::move(s);
  }
}

absl::StatusOr<double> LinkReduction::FinishBuckets() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    no_more_ = true;
    cv_.notify_all();
  }
  if (bucket_thread_.joinable()) bucket_thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = std::move(bucket_status_);
  bucket_status_ = absl::OkStatus();
  buckets_.clear();
  no_more_ = false;
  if (!s.ok()) return s;
  return bucket_seconds_;
}

RowRange LinkReduction::Slice(int64_t numel, int64_t q) const {
  const int64_t r = static_cast<int64_t>(peers_.size());
  return RowRange{numel * q / r, numel * (q + 1) / r};
}

absl::StatusOr<Tensor> LinkReduction::ReceiveSlice(int64_t from, int64_t step,
                                                   int64_t phase,
                                                   int64_t numel) {
  ASSIGN_OR_RETURN(Message m, peers_[from]->Receive());
  if (m.kind != MessageKind::kReduceSlice || m.step != step ||
      m.micro_batch != phase || !m.tensor.defined() ||
      m.tensor.device() != Device::kCpu || m.tensor.dtype() != DType::kF32 ||
      m.tensor.numel() != numel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica ", replica_, ": expected ",
        phase % 2 == 0 ? "gradient" : "summed", " slice of ", numel,
        " floats at step ", step, " from replica ", from, ", received ",
        Describe(m),
        m.tensor.defined() ? absl::StrCat(" of ", m.tensor.numel(), " values")
                           : ""));
  }
  bytes_received_ += m.tensor.nbytes();
  return std::move(m.tensor);
}

absl::StatusOr<Tensor> LinkReduction::GatherRows(int64_t replica, int64_t step,
                                                 Tensor rows) {
  const int64_t replicas = static_cast<int64_t>(peers_.size());
  const int64_t my_groups = shares_[replica_].end - shares_[replica_].begin;
  if (replica != replica_ || !rows.defined() || rows.rank() != 2 ||
      rows.device() != Device::kCpu || rows.dtype() != DType::kF32 ||
      my_groups < 1 || rows.dim(0) % my_groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica ", replica, ": rows to gather at step ", step,
        " must be a host matrix of whole gradient groups of replica ",
        replica_));
  }
  // Every group has as many micro-batches (rows) as this replica's.
  const int64_t per_group = rows.dim(0) / my_groups;
  const int64_t width = rows.dim(1);
  ConcurrentSends sends(this, [&]() -> absl::Status {
    for (int64_t q = 0; q < replicas; ++q) {
      if (q == replica_) continue;
      Message m;
      m.kind = MessageKind::kReduceSlice;
      m.step = step;
      m.micro_batch = kReduceRowsPhase;
      m.tensor = rows;
      bytes_sent_ += rows.nbytes();
      RETURN_IF_ERROR(peers_[q]->Send(std::move(m)));
    }
    return absl::OkStatus();
  });
  Tensor all;
  {
    AllocatorScope scope(DefaultCpuAllocator());
    all = Tensor::Empty({per_group * groups_, width});
  }
  for (int64_t q = 0; q < replicas; ++q) {
    const int64_t begin = shares_[q].begin * per_group;
    const int64_t count = (shares_[q].end - shares_[q].begin) * per_group;
    if (q == replica_) {
      std::copy(rows.f32(), rows.f32() + rows.numel(),
                all.f32() + begin * width);
      continue;
    }
    ASSIGN_OR_RETURN(Message m, peers_[q]->Receive());
    if (m.kind != MessageKind::kReduceSlice || m.step != step ||
        m.micro_batch != kReduceRowsPhase || !m.tensor.defined() ||
        m.tensor.device() != Device::kCpu || m.tensor.dtype() != DType::kF32 ||
        m.tensor.rank() != 2 || m.tensor.dim(0) != count ||
        m.tensor.dim(1) != width) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replica ", replica_, ": expected ", count,
          " rows of running statistics at step ", step, " from replica ", q,
          ", received ", Describe(m),
          m.tensor.defined()
              ? absl::StrCat(" of shape ", m.tensor.shape().ToString())
              : ""));
    }
    bytes_received_ += m.tensor.nbytes();
    std::copy(m.tensor.f32(), m.tensor.f32() + m.tensor.numel(),
              all.f32() + begin * width);
  }
  RETURN_IF_ERROR(sends.Join());
  return all;
}

absl::Status LinkReduction::Reduce(int64_t replica, int64_t step,
                                   std::vector<GradientNode> forest,
                                   const std::vector<NamedParameter>& params) {
  if (replica != replica_) {
    return absl::InvalidArgumentError(absl::StrCat("replica ", replica,
                                                   " reduces through replica ",
                                                   replica_, "'s links"));
  }
  return Sum(step, 0, std::move(forest), params);
}

absl::Status LinkReduction::Sum(int64_t step, int64_t phase,
                                std::vector<GradientNode> forest,
                                const std::vector<NamedParameter>& params) {
  const int64_t replicas = static_cast<int64_t>(peers_.size());
  if (shares_.size() != peers_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica ", replica_, " has ", shares_.size(),
                     " shares for ", peers_.size(), " replicas"));
  }
  for (const NamedParameter& p : params) {
    if (p.param->grad.device() != Device::kCpu) {
      return absl::UnimplementedError(
          "replicas over links sum gradients on the CPU so far");
    }
  }
  // Every replica's nodes, by shape; this one's must be what it holds.
  std::vector<std::vector<NodeSpan>> spans(replicas);
  for (int64_t q = 0; q < replicas; ++q)
    spans[q] = ForestSpans(shares_[q].begin, shares_[q].end);
  if (forest.size() != spans[replica_].size()) {
    return absl::InternalError(absl::StrCat(
        "replica ", replica_, " holds ", forest.size(), " gradient nodes for ",
        spans[replica_].size(), " of groups [", shares_[replica_].begin, ", ",
        shares_[replica_].end, ")"));
  }
  for (size_t n = 0; n < forest.size(); ++n) {
    if (forest[n].first != spans[replica_][n].first ||
        forest[n].level != spans[replica_][n].level ||
        forest[n].grads.size() != params.size()) {
      return absl::InternalError(
          absl::StrCat("replica ", replica_, ": gradient node ", n,
                       " is not the one its groups make"));
    }
  }
  // slices[q][i]: slice q of parameter i; floats[q]: their lengths' sum.
  std::vector<std::vector<RowRange>> slices(replicas);
  std::vector<int64_t> floats(replicas, 0);
  for (int64_t q = 0; q < replicas; ++q) {
    for (const NamedParameter& p : params) {
      slices[q].push_back(Slice(p.param->grad.numel(), q));
      floats[q] += slices[q].back().end - slices[q].back().begin;
    }
  }
  // Sends `out[q]` to every other replica q as phase + `half`.
  const auto send_all = [&](int64_t half, std::vector<Tensor> out) {
    return [this, step, phase, half, out = std::move(out)]() -> absl::Status {
      for (size_t q = 0; q < out.size(); ++q) {
        if (static_cast<int64_t>(q) == replica_) continue;
        Message m;
        m.kind = MessageKind::kReduceSlice;
        m.step = step;
        m.micro_batch = phase + half;
        bytes_sent_ += out[q].nbytes();
        m.tensor = out[q];
        RETURN_IF_ERROR(peers_[q]->Send(std::move(m)));
      }
      return absl::OkStatus();
    };
  };
  // Reduce-scatter: slice q of every node to replica q, sent while this
  // replica receives its own slices.
  std::vector<Tensor> outs(replicas);
  for (int64_t q = 0; q < replicas; ++q) {
    if (q == replica_) continue;
    outs[q] = Tensor::Empty({std::max<int64_t>(
        1, floats[q] * static_cast<int64_t>(forest.size()))});
    float* at = outs[q].f32();
    for (const GradientNode& node : forest) {
      for (size_t i = 0; i < params.size(); ++i) {
        const RowRange s = slices[q][i];
        at = std::copy(node.grads[i].f32() + s.begin,
                       node.grads[i].f32() + s.end, at);
      }
    }
  }
  ConcurrentSends scatter(this, send_all(0, std::move(outs)));
  const std::vector<RowRange>& own = slices[replica_];
  // This replica's slice of every replica's nodes, in group order: views
  // of its own gradients and of what the others sent (the tree adds into
  // them; nothing else reads them after).
  std::vector<GradientNode> mine;
  std::vector<NodeSpan> all;
  std::vector<Tensor> received(replicas);
  for (int64_t q = 0; q < replicas; ++q) {
    int64_t at = 0;
    if (q != replica_) {
      ASSIGN_OR_RETURN(
          received[q],
          ReceiveSlice(
              q, step, phase,
              std::max<int64_t>(1, floats[replica_] *
                                       static_cast<int64_t>(spans[q].size()))));
    }
    for (size_t n = 0; n < spans[q].size(); ++n) {
      GradientNode node;
      node.first = spans[q][n].first;
      node.level = spans[q][n].level;
      for (size_t i = 0; i < params.size(); ++i) {
        const RowRange s = own[i];
        const int64_t len = s.end - s.begin;
        if (len == 0) {
          node.grads.push_back(Tensor::Zeros({1}));
        } else if (q == replica_) {
          const Tensor& g = forest[n].grads[i];
          node.grads.push_back(g.Reshape({g.numel()}).Rows(s.begin, s.end));
        } else {
          node.grads.push_back(received[q].Rows(at, at + len));
          at += len;
        }
      }
      all.push_back(spans[q][n]);
      mine.push_back(std::move(node));
    }
  }
  RETURN_IF_ERROR(scatter.Join());
  RETURN_IF_ERROR(CheckForest(all, groups_));
  const TreePlan plan = PlanTree(all);
  std::vector<GradientNode*> nodes;
  for (GradientNode& n : mine) nodes.push_back(&n);
  for (size_t i = 0; i < params.size(); ++i)
    RunPlanSlice(plan, nodes, i, 0, own[i].end - own[i].begin);
  // All-gather: the summed slice into this replica's gradients and to
  // every other replica.
  const GradientNode& total = *nodes[plan.result];
  Tensor summed = Tensor::Empty({std::max<int64_t>(1, floats[replica_])});
  float* at = summed.f32();
  for (size_t i = 0; i < params.size(); ++i) {
    const RowRange s = own[i];
    const float* from = total.grads[i].f32();
    float* to = params[i].param->grad.f32() + s.begin;
    // The total may be the view of these very gradients.
    if (from != to) std::copy(from, from + (s.end - s.begin), to);
    at = std::copy(from, from + (s.end - s.begin), at);
  }
  // Read-only from here on: one tensor shared by every send.
  ConcurrentSends gather(this,
                         send_all(1, std::vector<Tensor>(replicas, summed)));
  for (int64_t q = 0; q < replicas; ++q) {
    if (q == replica_) continue;
    ASSIGN_OR_RETURN(
        const Tensor got,
        ReceiveSlice(q, step, phase + 1, std::max<int64_t>(1, floats[q])));
    const float* from = got.f32();
    for (size_t i = 0; i < params.size(); ++i) {
      const RowRange s = slices[q][i];
      std::copy(from, from + (s.end - s.begin),
                params[i].param->grad.f32() + s.begin);
      from += s.end - s.begin;
    }
  }
  RETURN_IF_ERROR(gather.Join());
  return absl::OkStatus();
}

}  // namespace gpipe
