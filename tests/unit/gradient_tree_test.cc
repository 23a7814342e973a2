// The gradient tree: however a step's groups are shared out among replicas
// (contiguous runs, any lengths), summing the replicas' forests gives the
// same bits as one process pushing every group.
#include "services/pipeline/gradient_tree.h"

#include <future>
#include <random>

#include "gtest/gtest.h"
#include "services/core/status.h"
#include "services/pipeline/in_process_reduction.h"
#include "services/pipeline/link_reduction.h"
#include "services/transport/in_process_link.h"
#include "tests/support/link_mesh.h"

namespace gpipe {
namespace {

// One parameter of `n` floats; its gradient is set per group.
struct OneParam {
  explicit OneParam(int64_t n) {
    p.value = Tensor::Zeros({n});
    p.grad = Tensor::Zeros({n});
    params.push_back({"w", &p});
  }
  Parameter p;
  std::vector<NamedParameter> params;
};

// Group g's gradient: values of very different magnitudes, so that the
// order of the additions shows in the bits.
std::vector<std::vector<float>> GroupGradients(int64_t groups, int64_t n) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::vector<float>> out(groups, std::vector<float>(n));
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t i = 0; i < n; ++i)
      out[g][i] = u(rng) * std::ldexp(1.0f, static_cast<int>(g * 7 % 23) - 11);
  return out;
}

// The forest of groups [begin, end), pushed as a replica would.
std::vector<GradientNode> Forest(const std::vector<std::vector<float>>& grads,
                                 int64_t begin, int64_t end) {
  OneParam one(static_cast<int64_t>(grads[0].size()));
  GradientTree tree;
  for (int64_t g = begin; g < end; ++g) {
    std::copy(grads[g].begin(), grads[g].end(), one.p.grad.f32());
    EXPECT_TRUE(tree.Push(g, one.params).ok());
    for (int64_t i = 0; i < one.p.grad.numel(); ++i)
      EXPECT_EQ(one.p.grad.f32()[i], 0.0f) << "Push zeroes the gradient";
  }
  return tree.TakeForest();
}

std::vector<float> Sum(std::vector<GradientNode> forest, int64_t groups,
                       int64_t n) {
  OneParam one(n);
  EXPECT_TRUE(FoldInto(std::move(forest), groups, one.params).ok());
  return std::vector<float>(one.p.grad.f32(), one.p.grad.f32() + n);
}

TEST(GradientTree, FourGroupsPairUp) {
  std::vector<NodeSpan> leaves = {{0, 0}, {1, 0}, {2, 0}, {3, 0}};
  const TreePlan plan = PlanTree(leaves);
  ASSERT_EQ(plan.adds.size(), 3u);
  EXPECT_EQ(plan.adds[0].into, 0);  // 0 += 1
  EXPECT_EQ(plan.adds[0].from, 1);
  EXPECT_EQ(plan.adds[1].into, 2);  // 2 += 3
  EXPECT_EQ(plan.adds[1].from, 3);
  EXPECT_EQ(plan.adds[2].into, 0);  // (0+1) += (2+3)
  EXPECT_EQ(plan.adds[2].from, 2);
  EXPECT_EQ(plan.result, 0);
}

// Every way of cutting G groups into contiguous runs (2^(G-1) of them),
// for G up to 8: the runs' forests sum to one process's bits.
TEST(GradientTree, EverySplitSumsToTheSameBits) {
  constexpr int64_t n = 33;
  for (int64_t groups = 1; groups <= 8; ++groups) {
    const auto grads = GroupGradients(groups, n);
    const std::vector<float> want = Sum(Forest(grads, 0, groups), groups, n);
    for (uint32_t cuts = 0; cuts < (1u << (groups - 1)); ++cuts) {
      std::vector<GradientNode> all;
      int64_t begin = 0;
      for (int64_t g = 1; g <= groups; ++g) {
        if (g < groups && !(cuts & (1u << (g - 1)))) continue;
        for (GradientNode& node : Forest(grads, begin, g))
          all.push_back(std::move(node));
        begin = g;
      }
      EXPECT_EQ(Sum(std::move(all), groups, n), want)
          << groups << " groups, cuts " << cuts;
    }
  }
}

// Not a sequential sum: with values of different magnitudes the tree's
// order shows.
TEST(GradientTree, DiffersFromASequentialSum) {
  constexpr int64_t n = 64;
  const auto grads = GroupGradients(4, n);
  const std::vector<float> tree = Sum(Forest(grads, 0, 4), 4, n);
  int differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    float s = 0;
    for (int g = 0; g < 4; ++g) s += grads[g][i];
    differ += s != tree[i];
  }
  EXPECT_GT(differ, 0);
}

TEST(GradientTree, RefusesGroupsOutOfOrderAndForestsWithGaps) {
  OneParam one(4);
  GradientTree tree;
  ASSERT_TRUE(tree.Push(0, one.params).ok());
  const absl::Status skipped = tree.Push(2, one.params);
  EXPECT_EQ(skipped.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(skipped.message().find("group 1 was due"), std::string::npos);

  EXPECT_TRUE(CheckForest({{0, 1}, {2, 0}}, 3).ok());
  EXPECT_FALSE(CheckForest({{0, 1}, {3, 0}}, 4).ok());  // group 2 missing
  EXPECT_FALSE(CheckForest({{1, 1}}, 3).ok());          // not aligned
  EXPECT_FALSE(CheckForest({{0, 0}}, 2).ok());          // short
  EXPECT_FALSE(CheckForest({{0, 2}}, 2).ok());          // too long
}

// What a replica can tell of another's forest from its groups alone.
TEST(GradientTree, ForestSpansAreWhatPushHolds) {
  const auto grads = GroupGradients(12, 3);
  for (int64_t begin = 0; begin < 12; ++begin) {
    for (int64_t end = begin + 1; end <= 12; ++end) {
      const std::vector<GradientNode> forest = Forest(grads, begin, end);
      const std::vector<NodeSpan> spans = ForestSpans(begin, end);
      ASSERT_EQ(forest.size(), spans.size()) << begin << ".." << end;
      for (size_t i = 0; i < spans.size(); ++i) {
        EXPECT_EQ(forest[i].first, spans[i].first);
        EXPECT_EQ(forest[i].level, spans[i].level);
      }
    }
  }
}

TEST(GradientTree, ReplicaMicroBatchesAreWholeGroups) {
  // M = 8 in 4 groups on 2 replicas: micro-batches 0-3 and 4-7.
  EXPECT_EQ(ReplicaMicroBatches(8, 4, 2, 0).begin, 0);
  EXPECT_EQ(ReplicaMicroBatches(8, 4, 2, 0).end, 4);
  EXPECT_EQ(ReplicaMicroBatches(8, 4, 2, 1).begin, 4);
  EXPECT_EQ(ReplicaMicroBatches(8, 4, 2, 1).end, 8);
  EXPECT_EQ(ReplicaMicroBatches(8, 4, 4, 3).begin, 6);
}

// Two replicas on threads: both end with the total, the same bits as one
// process.
TEST(InProcessReduction, BothReplicasGetTheTotal) {
  constexpr int64_t n = 1001;  // slices of unequal length
  const auto grads = GroupGradients(4, n);
  const std::vector<float> want = Sum(Forest(grads, 0, 4), 4, n);
  InProcessReduction reduction(2, 4);
  OneParam a(n), b(n);
  auto run = [&](int64_t replica, OneParam& mine) {
    return reduction.Reduce(
        replica, 0, Forest(grads, replica * 2, replica * 2 + 2), mine.params);
  };
  auto other = std::async(std::launch::async, [&] { return run(1, b); });
  ASSERT_TRUE(run(0, a).ok());
  ASSERT_TRUE(other.get().ok());
  EXPECT_EQ(std::vector<float>(a.p.grad.f32(), a.p.grad.f32() + n), want);
  EXPECT_EQ(std::vector<float>(b.p.grad.f32(), b.p.grad.f32() + n), want);
}

// A replica that never comes (its pipeline failed) must not leave the
// others waiting: Close wakes them.
TEST(InProcessReduction, CloseWakesAWaitingReplica) {
  InProcessReduction reduction(2, 2);
  OneParam a(4);
  auto waiting = std::async(std::launch::async, [&] {
    GradientNode node;
    node.first = 0;
    node.grads.push_back(a.p.grad);
    std::vector<GradientNode> forest;
    forest.push_back(std::move(node));
    return reduction.Reduce(0, 0, std::move(forest), a.params);
  });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(50)),
            std::future_status::timeout);
  reduction.Close();
  const absl::Status s = waiting.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
}

// Over links, a replica refuses what is not its peer's slice of this
// step (another step, another size) with an error that names it, and the
// others are woken by Close instead of waiting.
TEST(LinkReduction, RefusesASliceOfAnotherStepOrSize) {
  constexpr int64_t n = 10;
  const std::vector<RowRange> shares = {{0, 1}, {1, 2}};
  OneParam a(n);
  for (int64_t step : {3, 4}) {
    auto [to_1, to_0] = MakeInProcessLinkPair(4);
    LinkReduction zero(0, 2, shares, {nullptr, to_1.get()});
    // The peer's gradient slice should be 5 floats of this step: first 7
    // floats of step 3, then 5 floats of step 3 for step 4.
    Message m;
    m.kind = MessageKind::kReduceSlice;
    m.step = 3;
    m.micro_batch = 0;
    m.tensor = Tensor::Zeros({step == 3 ? 7 : 5});
    ASSERT_TRUE(to_0->Send(std::move(m)).ok());
    GradientNode node;
    node.first = 0;
    node.grads.push_back(a.p.grad);
    std::vector<GradientNode> forest;
    forest.push_back(std::move(node));
    const absl::Status s = zero.Reduce(0, step, std::move(forest), a.params);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("from replica 1"), std::string::npos) << s;
    // A failed sum closes its links: the peer hears of it, nobody waits.
    EXPECT_FALSE(to_0->Send(Message()).ok());
  }
}

// Three replicas over links: each ends with the one process's bits.
TEST(LinkReduction, ThreeReplicasGetTheTotal) {
  constexpr int64_t n = 101;
  const auto grads = GroupGradients(6, n);
  const std::vector<float> want = Sum(Forest(grads, 0, 6), 6, n);
  // Uneven shares, as after a replica is lost: 3, 1 and 2 groups.
  const std::vector<RowRange> shares = {{0, 3}, {3, 4}, {4, 6}};
  const test_support::LinkMesh mesh(3, 4);
  const auto& peers = mesh.peers;
  std::vector<std::unique_ptr<OneParam>> params;
  std::vector<std::future<absl::Status>> done;
  std::vector<std::unique_ptr<LinkReduction>> reducers;
  for (int r = 0; r < 3; ++r) {
    params.push_back(std::make_unique<OneParam>(n));
    reducers.push_back(std::make_unique<LinkReduction>(r, 6, shares, peers[r]));
  }
  for (int r = 0; r < 3; ++r) {
    done.push_back(std::async(std::launch::async, [&, r] {
      return reducers[r]->Reduce(r, 9,
                                 Forest(grads, shares[r].begin, shares[r].end),
                                 params[r]->params);
    }));
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(done[r].get().ok()) << r;
    const float* g = params[r]->p.grad.f32();
    EXPECT_EQ(std::vector<float>(g, g + n), want) << "replica " << r;
    EXPECT_GT(reducers[r]->bytes_sent(), 0);
  }
}

// Buckets (the overlap with the drain): three replicas of one group each
// hand in their parameters in two buckets, in the order the backward
// finishes them (the last parameter first), while their callers go on;
// every replica ends with the bits of one Reduce over all parameters, and
// those are the one process's.
TEST(LinkReduction, BucketsSumToReducesBits) {
  const std::vector<int64_t> sizes = {37, 5, 64};
  const auto grads = GroupGradients(3, 37 + 5 + 64);
  const std::vector<RowRange> shares = {{0, 1}, {1, 2}, {2, 3}};
  // Runs R=3 replicas, bucketed or not; [replica][parameter] -> gradient.
  auto run = [&](bool buckets) {
    const test_support::LinkMesh mesh(3, 4);
    const auto& peers = mesh.peers;
    std::vector<std::vector<Parameter>> params(3, std::vector<Parameter>(3));
    std::vector<std::unique_ptr<LinkReduction>> reducers;
    std::vector<std::future<absl::Status>> done;
    for (int r = 0; r < 3; ++r) {
      int64_t at = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        params[r][i].value = Tensor::Zeros({sizes[i]});
        params[r][i].grad = Tensor::Zeros({sizes[i]});
        std::copy(grads[r].begin() + at, grads[r].begin() + at + sizes[i],
                  params[r][i].grad.f32());
        at += sizes[i];
      }
      reducers.push_back(
          std::make_unique<LinkReduction>(r, 3, shares, peers[r]));
    }
    for (int r = 0; r < 3; ++r) {
      done.push_back(std::async(std::launch::async, [&, r] {
        std::vector<NamedParameter> named;
        for (size_t i = 0; i < sizes.size(); ++i)
          named.push_back({"p" + std::to_string(i), &params[r][i]});
        auto node_of = [&](size_t begin, size_t end) {
          GradientNode node;
          node.first = r;
          for (size_t i = begin; i < end; ++i)
            node.grads.push_back(named[i].param->grad);
          return node;
        };
        if (!buckets) {
          std::vector<GradientNode> forest;
          forest.push_back(node_of(0, 3));
          return reducers[r]->Reduce(r, 5, std::move(forest), named);
        }
        RETURN_IF_ERROR(reducers[r]->StartBucket(
            r, 5, 0, node_of(2, 3), {named.begin() + 2, named.end()}));
        RETURN_IF_ERROR(reducers[r]->StartBucket(
            r, 5, 1, node_of(0, 2), {named.begin(), named.begin() + 2}));
        absl::StatusOr<double> seconds = reducers[r]->FinishBuckets();
        if (seconds.ok()) {
          EXPECT_GE(*seconds, 0.0);
        }
        return seconds.status();
      }));
    }
    std::vector<std::vector<std::vector<float>>> out(3);
    for (int r = 0; r < 3; ++r) {
      const absl::Status s = done[r].get();
      EXPECT_TRUE(s.ok()) << "replica " << r << ": " << s;
      for (const Parameter& p : params[r])
        out[r].emplace_back(p.grad.f32(), p.grad.f32() + p.grad.numel());
    }
    return out;
  };
  const auto whole = run(false);
  const auto bucketed = run(true);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(bucketed[r], whole[0]) << "replica " << r;
    EXPECT_EQ(whole[r], whole[0]) << "replica " << r;
  }
  // And the one process's bits, parameter by parameter.
  const std::vector<float> one = Sum(Forest(grads, 0, 3), 3, 37 + 5 + 64);
  EXPECT_EQ(std::vector<float>(one.begin(), one.begin() + 37), whole[0][0]);
  EXPECT_EQ(std::vector<float>(one.begin() + 42, one.end()), whole[0][2]);
}

// A replica that numbers its buckets otherwise, or hands in a bucket that
// is not one group of its share, is refused; a closed reduction's pending
// buckets end with an error instead of a hang.
TEST(LinkReduction, MismatchedOrClosedBucketsFail) {
  auto [to_1, to_0] = MakeInProcessLinkPair(4);
  const std::vector<RowRange> shares = {{0, 1}, {1, 2}};
  LinkReduction zero(0, 2, shares, {nullptr, to_1.get()});
  LinkReduction one(1, 2, shares, {to_0.get(), nullptr});
  OneParam a(8), b(8);
  auto node = [](OneParam& p, int64_t first) {
    GradientNode n;
    n.first = first;
    n.grads.push_back(p.p.grad);
    return n;
  };
  EXPECT_TRUE(absl::IsInvalidArgument(
      zero.StartBucket(0, 1, 0, node(a, 1), a.params)));  // not its group
  EXPECT_TRUE(absl::IsInvalidArgument(
      zero.StartBucket(1, 1, 0, node(a, 0), a.params)));  // not this replica
  ASSERT_TRUE(zero.StartBucket(0, 1, 0, node(a, 0), a.params).ok());
  ASSERT_TRUE(one.StartBucket(1, 1, 3, node(b, 1), b.params).ok());
  const absl::Status s0 = zero.FinishBuckets().status(),
                     s1 = one.FinishBuckets().status();
  // The first to see the other's bucket names it; it then closes the
  // links, so the other may only hear that they closed.
  EXPECT_FALSE(s0.ok());
  EXPECT_FALSE(s1.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(s0) || absl::IsInvalidArgument(s1))
      << s0 << " / " << s1;
  // Closed while a bucket waits for its peer: the wait ends.
  auto [to_peer, from_lonely] = MakeInProcessLinkPair(4);
  LinkReduction lonely(0, 2, shares, {nullptr, to_peer.get()});
  ASSERT_TRUE(lonely.StartBucket(0, 2, 0, node(a, 0), a.params).ok());
  lonely.Close();
  EXPECT_FALSE(lonely.FinishBuckets().ok());
}

}  // namespace
}  // namespace gpipe
