// The schedules as data: op lists checked directly, without running them.
#include "services/pipeline/schedule.h"

#include <deque>
#include <map>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace gpipe {
namespace {

std::string Render(const std::vector<Op>& ops) {
  std::string s;
  for (const Op& op : ops) s += (s.empty() ? "" : " ") + ToString(op);
  return s;
}

TEST(Schedule, GPipeIsFillDrain) {
  EXPECT_EQ(Render(MakeSchedule(ScheduleKind::kGPipe, 3, 4, 1)),
            "F0 F1 F2 F3 B0 B1 B2 B3 step");
}

TEST(Schedule, OneFOneBWarmsUpThenAlternates) {
  EXPECT_EQ(Render(MakeSchedule(ScheduleKind::kOneFOneB, 2, 4, 0)),
            "F0 F1 B0 F2 B1 F3 B2 B3 step");
  EXPECT_EQ(Render(MakeSchedule(ScheduleKind::kOneFOneB, 2, 4, 1)),
            "F0 B0 F1 B1 F2 B2 F3 B3 step");
  EXPECT_EQ(Render(MakeSchedule(ScheduleKind::kOneFOneB, 4, 2, 0)),
            "F0 F1 B0 B1 step");
}

// The runtime's lists: each receive just before the op it feeds, each
// send just after the op that made it; none over a link a stage does not
// have (stage 0 receives no activation, the last stage no gradient).
TEST(Schedule, TransfersAreActionsNextToTheirOps) {
  EXPECT_EQ(Render(WithTransfers(MakeSchedule(ScheduleKind::kOneFOneB, 2, 2, 0),
                                 ScheduleKind::kOneFOneB, 2, 1, 0)),
            "F0 sa0 F1 sa1 rg0 B0 rg1 B1 step");
  EXPECT_EQ(Render(WithTransfers(MakeSchedule(ScheduleKind::kOneFOneB, 2, 2, 1),
                                 ScheduleKind::kOneFOneB, 2, 1, 1)),
            "ra0 F0 B0 sg0 ra1 F1 B1 sg1 step");
  EXPECT_EQ(
      Render(WithTransfers(MakeSchedule(ScheduleKind::kZeroBubbleH1, 3, 1, 1),
                           ScheduleKind::kZeroBubbleH1, 3, 1, 1)),
      "ra0 F0 sa0 rg0 B0 sg0 W0 step");
  // A single stage has no links.
  EXPECT_EQ(Render(WithTransfers(MakeSchedule(ScheduleKind::kGPipe, 1, 2, 0),
                                 ScheduleKind::kGPipe, 1, 1, 0)),
            "F0 F1 B0 B1 step");
  // Interleaved: worker 1 of 2 holds stages 1 and 3 of 4; its chunk 0 sends
  // on to worker 0's chunk 1, and its chunk 1 is the last stage.
  EXPECT_EQ(Render(WithTransfers(
                MakeWorkerSchedule(ScheduleKind::kInterleaved1F1B, 2, 2, 2, 1),
                ScheduleKind::kInterleaved1F1B, 2, 2, 1)),
            "ra0 F0 sa0 ra1 F1 sa1 ra0/1 F0/1 B0/1 sg0/1 ra1/1 F1/1 B1/1 "
            "sg1/1 rg0 B0 sg0 rg1 B1 sg1 step");
  // A list with transfers already is the runtime's as it is.
  const std::vector<Op> lowered =
      WithTransfers(MakeSchedule(ScheduleKind::kOneFOneB, 3, 4, 1),
                    ScheduleKind::kOneFOneB, 3, 1, 1);
  EXPECT_TRUE(HasTransfers(lowered));
  EXPECT_FALSE(HasTransfers(MakeSchedule(ScheduleKind::kOneFOneB, 3, 4, 1)));
  EXPECT_EQ(WithTransfers(lowered, ScheduleKind::kOneFOneB, 3, 1, 1), lowered);
}

// B is the input half here, W the weight half (the paper's notation).
TEST(Schedule, ZeroBubbleH1DefersEachStagesWeightsByItsIndex) {
  EXPECT_EQ(Render(MakeSchedule(ScheduleKind::kZeroBubbleH1, 2, 4, 0)),
            "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3 step");
  EXPECT_EQ(Render(MakeSchedule(ScheduleKind::kZeroBubbleH1, 2, 4, 1)),
            "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3 step");
  EXPECT_EQ(Render(MakeSchedule(ScheduleKind::kZeroBubbleH1, 4, 6, 3)),
            "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 W3 W4 W5 step");
  // Fewer micro-batches than stages: warm-up with all of them.
  EXPECT_EQ(Render(MakeSchedule(ScheduleKind::kZeroBubbleH1, 4, 2, 0)),
            "F0 F1 B0 W0 B1 W1 step");
  for (int64_t s = 0; s < 4; ++s) {
    const std::vector<Op> ops =
        MakeSchedule(ScheduleKind::kZeroBubbleH1, 4, 8, s);
    EXPECT_EQ(MaxLiveMicroBatches(ops), 4) << "stage " << s;
    EXPECT_EQ(MaxDeferredMicroBatches(ops), s + 1) << "stage " << s;
  }
}

// Worker w of K holds chunks w and w + K; "/1" marks chunk 1. Forwards go
// in groups of K micro-batches chunk by chunk, backwards with the chunks
// reversed, after a warm-up of 2(K-w-1) + (v-1)K forwards.
TEST(Schedule, InterleavedRunsEachWorkersChunksInGroups) {
  EXPECT_EQ(
      Render(MakeWorkerSchedule(ScheduleKind::kInterleaved1F1B, 2, 2, 2, 0)),
      "F0 F1 F0/1 F1/1 B0/1 B1/1 B0 B1 step");
  EXPECT_EQ(
      Render(MakeWorkerSchedule(ScheduleKind::kInterleaved1F1B, 2, 2, 2, 1)),
      "F0 F1 F0/1 B0/1 F1/1 B1/1 B0 B1 step");
  EXPECT_EQ(
      Render(MakeWorkerSchedule(ScheduleKind::kInterleaved1F1B, 2, 4, 2, 1)),
      "F0 F1 F0/1 B0/1 F1/1 B1/1 F2 B0 F3 B1 F2/1 B2/1 F3/1 B3/1 B2 B3 step");
  // v = 1 is 1F1B.
  EXPECT_EQ(MakeWorkerSchedule(ScheduleKind::kInterleaved1F1B, 3, 6, 1, 1),
            MakeSchedule(ScheduleKind::kOneFOneB, 3, 6, 1));
  EXPECT_EQ(ScheduleShapeError(ScheduleKind::kInterleaved1F1B, 4, 8, 2), "");
  EXPECT_NE(ScheduleShapeError(ScheduleKind::kInterleaved1F1B, 4, 6, 2), "");
  EXPECT_NE(ScheduleShapeError(ScheduleKind::kInterleaved1F1B, 4, 8, 1), "");
  EXPECT_NE(ScheduleShapeError(ScheduleKind::kOneFOneB, 4, 8, 2), "");
}

// Each chunk of each worker runs its forwards, then backwards, in
// micro-batch order (so gradients sum as in the reference), each backward
// after its forward, and every op once.
TEST(Schedule, InterleavedChunksRunInMicroBatchOrder) {
  for (int64_t v : {2, 3, 4}) {
    for (int64_t k : {1, 2, 3, 4, 8}) {
      for (int64_t m = k; m <= 16; m += k) {
        for (int64_t w = 0; w < k; ++w) {
          const std::vector<Op> ops =
              MakeWorkerSchedule(ScheduleKind::kInterleaved1F1B, k, m, v, w);
          ASSERT_EQ(ops.size(), static_cast<size_t>(2 * v * m + 1));
          EXPECT_EQ(ops.back().kind, OpKind::kOptimizerStep);
          std::vector<int64_t> forwards(v, 0), backwards(v, 0);
          for (size_t i = 0; i + 1 < ops.size(); ++i) {
            const Op& op = ops[i];
            ASSERT_GE(op.chunk, 0);
            ASSERT_LT(op.chunk, v);
            if (op.kind == OpKind::kForward) {
              EXPECT_EQ(op.micro_batch, forwards[op.chunk]++);
            } else {
              ASSERT_EQ(op.kind, OpKind::kBackward);
              EXPECT_EQ(op.micro_batch, backwards[op.chunk]++);
              EXPECT_LT(op.micro_batch, forwards[op.chunk]) << "B before F";
            }
          }
          for (int64_t c = 0; c < v; ++c) {
            EXPECT_EQ(forwards[c], m);
            EXPECT_EQ(backwards[c], m);
          }
          // Megatron's warm-up bound: never more in flight than it.
          EXPECT_LE(MaxLiveMicroBatches(ops),
                    std::min(v * m, 2 * (k - w - 1) + (v - 1) * k + 1));
        }
      }
    }
  }
}

// ZB-V places worker w's chunks at stages w and 2K-1-w: a micro-batch goes
// down the workers and back up, so worker 0 holds the first and the last
// stage and the turn (stages K-1 and K) is on worker K-1.
TEST(Schedule, ZeroBubbleVPlacesTwoChunksInAV) {
  for (int64_t k : {1, 2, 3, 5, 8}) {
    for (int64_t g = 0; g < 2 * k; ++g) {
      const int64_t w = WorkerOfStage(ScheduleKind::kZeroBubbleV, k, g);
      const int64_t c = ChunkOfStage(ScheduleKind::kZeroBubbleV, k, g);
      EXPECT_EQ(StageOfChunk(ScheduleKind::kZeroBubbleV, k, w, c), g);
      EXPECT_EQ(w, g < k ? g : 2 * k - 1 - g);
      // Round robin for interleaving.
      EXPECT_EQ(WorkerOfStage(ScheduleKind::kInterleaved1F1B, k, g), g % k);
      EXPECT_EQ(StageOfChunk(ScheduleKind::kInterleaved1F1B, k, g % k, g / k),
                g);
    }
  }
  EXPECT_EQ(ScheduleShapeError(ScheduleKind::kZeroBubbleV, 4, 3, 2), "");
  EXPECT_NE(ScheduleShapeError(ScheduleKind::kZeroBubbleV, 4, 8, 3), "");
  EXPECT_NE(ScheduleShapeError(ScheduleKind::kZeroBubbleV, 4, 8, 1), "");
  EXPECT_EQ(ChunksPerWorker(ScheduleKind::kZeroBubbleV, 0), 2);
  // Left out, interleaving holds 2, as `--schedule interleaved` does; an
  // explicit 1 stays, for ScheduleShapeError to refuse.
  EXPECT_EQ(ChunksPerWorker(ScheduleKind::kInterleaved1F1B, 0), 2);
  EXPECT_EQ(ChunksPerWorker(ScheduleKind::kInterleaved1F1B, 1), 1);
  // One chunk per worker is ZB-H1.
  EXPECT_EQ(MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, 3, 6, 1, 1),
            MakeSchedule(ScheduleKind::kZeroBubbleH1, 3, 6, 1));
}

// "/1" marks chunk 1 (stage 2K-1-w). Worker 0 runs the first and the last
// stage: its chunk-0 forwards until micro-batch 0 comes back, then input
// halves first, forwards next, weight halves where nothing else is ready.
TEST(Schedule, ZeroBubbleVRendersItsOrder) {
  EXPECT_EQ(Render(MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, 2, 4, 2, 0)),
            "F0 F1 F2 F0/1 B0/1 W0/1 F1/1 B0 B1/1 W0 F3 B1 W1/1 F2/1 B2/1 W1 "
            "W2/1 B2 W2 F3/1 B3/1 W3/1 B3 W3 step");
  EXPECT_EQ(Render(MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, 2, 4, 2, 1)),
            "F0 F0/1 F1 F1/1 B0/1 B0 W0/1 F2 B1/1 B1 W0 F2/1 W1/1 F3 B2/1 B2 "
            "W1 F3/1 W2/1 W2 B3/1 B3 W3/1 W3 step");
  // Worker K-1 sends from its chunk 0 (stage K-1) to its chunk 1 (stage K)
  // over a link to itself.
  EXPECT_EQ(
      Render(WithTransfers(
          MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, 2, 2, 2, 1),
          ScheduleKind::kZeroBubbleV, 2, 2, 1)),
      "ra0 F0 sa0 ra0/1 F0/1 sa0/1 ra1 F1 sa1 ra1/1 F1/1 sa1/1 rg0/1 B0/1 "
      "sg0/1 rg0 B0 sg0 rg1/1 B1/1 sg1/1 rg1 B1 sg1 W0/1 W0 W1/1 W1 step");
}

// Worker w's ZB-V ops (of K workers, M micro-batches): each chunk's
// forwards, input halves and weight halves each in micro-batch order, a
// micro-batch's F before its B before its W, every op once, the step last,
// and at most 2K micro-batches held between F and W.
void ExpectZeroBubbleVWorkerOrder(const std::vector<Op>& ops, int64_t k,
                                  int64_t m, int64_t w) {
  ASSERT_EQ(ops.size(), static_cast<size_t>(6 * m + 1));
  EXPECT_EQ(ops.back().kind, OpKind::kOptimizerStep);
  int64_t next[2][3] = {};
  for (size_t i = 0; i + 1 < ops.size(); ++i) {
    const Op& op = ops[i];
    ASSERT_TRUE(op.chunk == 0 || op.chunk == 1);
    const int kind = op.kind == OpKind::kForward         ? 0
                     : op.kind == OpKind::kBackwardInput ? 1
                                                         : 2;
    ASSERT_TRUE(kind != 2 || op.kind == OpKind::kBackwardWeight);
    EXPECT_EQ(op.micro_batch, next[op.chunk][kind]++)
        << "k=" << k << " m=" << m << " w=" << w << " op " << i;
    if (kind > 0) EXPECT_LT(op.micro_batch, next[op.chunk][kind - 1]);
  }
  for (const auto& chunk : next)
    for (int64_t n : chunk) EXPECT_EQ(n, m);
  EXPECT_LE(MaxLiveMicroBatches(ops), 2 * k)
      << "k=" << k << " m=" << m << " w=" << w;
}

// Each stage of each worker runs its forwards, input halves and weight
// halves each in micro-batch order (so gradients sum as in the reference),
// a micro-batch's F before its B before its W, every op once, and no worker
// holds more than 2K micro-batches of a chunk between F and W.
TEST(Schedule, ZeroBubbleVKeepsMicroBatchOrderAndItsMemory) {
  for (int64_t k = 1; k <= 16; ++k) {
    for (int64_t m : {1, 2, 3, 5, 8, 13, 16, 32, 64}) {
      for (int64_t w = 0; w < k; ++w) {
        const std::vector<Op> ops =
            MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, k, m, 2, w);
        ExpectZeroBubbleVWorkerOrder(ops, k, m, w);
      }
    }
  }
}

// Equal phase times, of any length, give the paper's order (the unit-time
// one above); ticks that are not a set per stage in range give it too.
TEST(Schedule, ZeroBubbleVWithEqualPhaseTimesIsThePapersOrder) {
  for (int64_t k : {1, 2, 3, 4, 8}) {
    for (int64_t m : {1, 3, 8, 16}) {
      const std::vector<PhaseTicks> equal(2 * k, PhaseTicks{7, 7, 7});
      std::vector<PhaseTicks> short_by_one(2 * k - 1, PhaseTicks{1, 3, 1});
      std::vector<PhaseTicks> zero(2 * k, PhaseTicks{1, 3, 1});
      zero.back().weight = 0;
      for (int64_t w = 0; w < k; ++w) {
        const std::vector<Op> unit =
            MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, k, m, 2, w);
        EXPECT_EQ(
            MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, k, m, 2, w, equal),
            unit);
        EXPECT_EQ(MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, k, m, 2, w,
                                     short_by_one),
                  unit);
        EXPECT_EQ(
            MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, k, m, 2, w, zero),
            unit);
      }
    }
  }
}

TEST(Schedule, PhaseTicksErrorSaysWhatIsWrong) {
  EXPECT_EQ(PhaseTicksError({}, 4), "");
  const std::vector<PhaseTicks> four(4);
  EXPECT_EQ(PhaseTicksError(four, 4), "");
  EXPECT_EQ(PhaseTicksError(four, 6), "4 stages' phase times for 6 stages");
  std::vector<PhaseTicks> bad = four;
  bad[2].input = kMaxPhaseTicks + 1;
  EXPECT_EQ(PhaseTicksError(bad, 4),
            "stage 2's phase time 1048577 ticks is not in [1, 1048576]");
}

// With unequal phase times the order changes (input halves a third longer
// than forwards: each worker waits less for the gradients), and keeps what
// every ZB-V order keeps: each stage's forwards, input halves and weight
// halves each in micro-batch order, a micro-batch's F before its B before
// its W, every op once, at most 2K micro-batches held (times drawn at
// random, seeded).
TEST(Schedule, ZeroBubbleVForPhaseTimesKeepsMicroBatchOrderAndItsMemory) {
  const std::vector<PhaseTicks> longer_inputs(4, PhaseTicks{100, 130, 100});
  EXPECT_NE(
      MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, 2, 8, 2, 0, longer_inputs),
      MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, 2, 8, 2, 0));
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> tick(1, 2000);
  for (int64_t k : {1, 2, 3, 4, 8, 16}) {
    for (int64_t m : {1, 2, 5, 8, 16, 64}) {
      std::vector<PhaseTicks> ticks(2 * k);
      for (PhaseTicks& t : ticks) t = {tick(rng), tick(rng), tick(rng)};
      for (int64_t w = 0; w < k; ++w) {
        const std::vector<Op> ops =
            MakeWorkerSchedule(ScheduleKind::kZeroBubbleV, k, m, 2, w, ticks);
        ExpectZeroBubbleVWorkerOrder(ops, k, m, w);
      }
    }
  }
}

TEST(Schedule, NameRoundTrip) {
  EXPECT_EQ(*ParseScheduleName("gpipe"), ScheduleKind::kGPipe);
  EXPECT_EQ(*ParseScheduleName("1f1b"), ScheduleKind::kOneFOneB);
  EXPECT_EQ(*ParseScheduleName("zb-h1"), ScheduleKind::kZeroBubbleH1);
  EXPECT_EQ(*ParseScheduleName("ZERO_BUBBLE_H1"), ScheduleKind::kZeroBubbleH1);
  EXPECT_FALSE(ParseScheduleName("interleaved-zb").ok());
  EXPECT_EQ(*ParseScheduleName("interleaved"), ScheduleKind::kInterleaved1F1B);
  EXPECT_EQ(*ParseScheduleName("ZERO_BUBBLE_V"), ScheduleKind::kZeroBubbleV);
  for (ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
        ScheduleKind::kZeroBubbleH1, ScheduleKind::kInterleaved1F1B,
        ScheduleKind::kZeroBubbleV}) {
    EXPECT_EQ(*ParseScheduleName(ScheduleName(kind)), kind);
    EXPECT_EQ(ScheduleFromSpec(ScheduleToSpec(kind)), kind);
  }
}

bool IsBackward(const Op& op) {
  return op.kind == OpKind::kBackward || op.kind == OpKind::kBackwardInput;
}

class ScheduleProperties : public ::testing::TestWithParam<
                               std::tuple<ScheduleKind, int64_t, int64_t>> {};

TEST_P(ScheduleProperties, EveryStageIsWellFormed) {
  const auto [kind, k, m] = GetParam();
  const bool split = SplitsBackward(kind);
  for (int64_t s = 0; s < k; ++s) {
    const std::vector<Op> ops = MakeSchedule(kind, k, m, s);
    ASSERT_EQ(ops.size(), static_cast<size_t>((split ? 3 : 2) * m + 1));
    EXPECT_EQ(ops.back().kind, OpKind::kOptimizerStep);
    std::set<int64_t> forwarded;
    int64_t next_backward = 0, next_weight = 0;
    for (size_t i = 0; i + 1 < ops.size(); ++i) {
      const Op& op = ops[i];
      ASSERT_GE(op.micro_batch, 0);
      ASSERT_LT(op.micro_batch, m);
      if (op.kind == OpKind::kForward) {
        EXPECT_TRUE(forwarded.insert(op.micro_batch).second) << "F twice";
      } else if (op.kind == OpKind::kBackwardWeight) {
        ASSERT_TRUE(split);
        // After its input half, in micro-batch order: each parameter's
        // gradient sums in the reference's order.
        EXPECT_LT(op.micro_batch, next_backward) << "W before its B";
        EXPECT_EQ(op.micro_batch, next_weight++);
      } else {
        ASSERT_EQ(op.kind, split ? OpKind::kBackwardInput : OpKind::kBackward);
        EXPECT_TRUE(forwarded.count(op.micro_batch)) << "B before its F";
        // Backward order 0..M-1: gradients accumulate as in the reference.
        EXPECT_EQ(op.micro_batch, next_backward++);
      }
    }
    EXPECT_EQ(static_cast<int64_t>(forwarded.size()), m);
    EXPECT_EQ(next_weight, split ? m : 0);
    const int64_t live = MaxLiveMicroBatches(ops);
    if (kind == ScheduleKind::kGPipe) EXPECT_EQ(live, m);
    // ZB-H1 holds as many on every stage as 1F1B on its first.
    if (kind != ScheduleKind::kGPipe) EXPECT_LE(live, k);
  }
}

// On the runtime's lists (WithTransfers): the sends of stage s are the
// receives of s+1 in the same order, each op's operand is received before
// it and its output sent after it, and running all stages against unbounded
// FIFO links finishes with every link empty (no deadlock, no message left).
TEST_P(ScheduleProperties, NeighboursAgreeAndTheStepCompletes) {
  const auto [kind, k, m] = GetParam();
  std::vector<std::vector<Op>> ops;
  for (int64_t s = 0; s < k; ++s)
    ops.push_back(WithTransfers(MakeSchedule(kind, k, m, s), kind, k, 1, s));
  const auto micro_batches = [](const std::vector<Op>& list, OpKind kind) {
    std::vector<int64_t> out;
    for (const Op& op : list)
      if (op.kind == kind) out.push_back(op.micro_batch);
    return out;
  };
  for (int64_t s = 0; s + 1 < k; ++s) {
    EXPECT_EQ(micro_batches(ops[s], OpKind::kSendActivation),
              micro_batches(ops[s + 1], OpKind::kReceiveActivation))
        << "stage " << s;
    EXPECT_EQ(micro_batches(ops[s + 1], OpKind::kSendGradient),
              micro_batches(ops[s], OpKind::kReceiveGradient))
        << "stage " << s;
  }
  EXPECT_TRUE(micro_batches(ops[0], OpKind::kReceiveActivation).empty());
  EXPECT_TRUE(micro_batches(ops[k - 1], OpKind::kReceiveGradient).empty());
  // down[s]: activations from s to s+1; up[s]: gradients from s+1 to s.
  std::vector<std::deque<int64_t>> down(k), up(k);
  // Per stage, what receives hold and what ops made, by micro-batch.
  std::vector<std::set<int64_t>> received(k), made(k);
  std::vector<size_t> pc(k, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t s = 0; s < k; ++s) {
      if (pc[s] >= ops[s].size()) continue;
      const Op& op = ops[s][pc[s]];
      const int64_t i = op.micro_batch;
      if (op.kind == OpKind::kReceiveActivation ||
          op.kind == OpKind::kReceiveGradient) {
        std::deque<int64_t>& link =
            op.kind == OpKind::kReceiveActivation ? down[s - 1] : up[s];
        if (link.empty()) continue;
        EXPECT_EQ(link.front(), i);
        link.pop_front();
        EXPECT_TRUE(received[s].insert(i).second);
      } else if (op.kind == OpKind::kSendActivation ||
                 op.kind == OpKind::kSendGradient) {
        EXPECT_EQ(made[s].erase(i), 1u) << "stage " << s << " sends " << i;
        (op.kind == OpKind::kSendActivation ? down[s] : up[s - 1]).push_back(i);
      } else if (op.kind == OpKind::kForward || IsBackward(op)) {
        const bool forward = op.kind == OpKind::kForward;
        if (forward ? s > 0 : s + 1 < k)
          EXPECT_EQ(received[s].erase(i), 1u) << "stage " << s << " op " << i;
        if (forward ? s + 1 < k : s > 0) made[s].insert(i);
      }
      ++pc[s];
      progress = true;
    }
  }
  for (int64_t s = 0; s < k; ++s) {
    EXPECT_EQ(pc[s], ops[s].size()) << "stage " << s << " stuck";
    EXPECT_TRUE(down[s].empty() && up[s].empty()) << "link " << s;
    EXPECT_TRUE(received[s].empty() && made[s].empty()) << "stage " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllShapes, ScheduleProperties,
    ::testing::Combine(::testing::Values(ScheduleKind::kGPipe,
                                         ScheduleKind::kOneFOneB,
                                         ScheduleKind::kZeroBubbleH1),
                       ::testing::Values(1, 2, 3, 4, 8),
                       ::testing::Values(1, 2, 3, 4, 8, 16)));

}  // namespace
}  // namespace gpipe
