// Measured bubble on a balanced pipeline against GPipe's (K-1)/(M+K-1).
//
// K stage threads run the real GPipe schedule (MakeSchedule) over real
// in-process links, time their ops with the stage Timeline and feed each step
// to StageMetrics through MeteredLinks, as a worker does. Every op "computes"
// by sleeping a fixed time: the stages are then equal-cost whatever else
// the machine runs and however few cores it has (K=4 threads on 2 loaded
// cores would otherwise time-share and stretch each other's ops), which is
// what the formula assumes. Waiting for a neighbour's message is not op time,
// exactly as in Stage. The slack allowed is 0.05 plus the transport's share
// of the wall time (send durations, which the ops include).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/timeline.h"
#include "services/telemetry/metered_link.h"
#include "services/telemetry/stage_metrics.h"
#include "services/telemetry/step_figures.h"
#include "services/transport/in_process_link.h"

namespace gpipe {
namespace {

using std::chrono::milliseconds;

// Long enough that a thread's late wake-up on a loaded machine (a
// millisecond or two, each one bubble on every stage after it) stays well
// inside the slack: at 5 ms ops K=4 M=16 measured up to 0.03 over the
// formula idle and failed under CI's load.
constexpr milliseconds kForward(15);
constexpr milliseconds kBackward(30);
constexpr milliseconds kOptimizer(1);
constexpr int kSteps = 3;

Message Make(MessageKind kind, int64_t step, int64_t m) {
  Message msg;
  msg.kind = kind;
  msg.step = step;
  msg.micro_batch = m;
  msg.tensor = Tensor::Zeros(Shape({4, 8}));
  return msg;
}

struct StageRun {
  int64_t index = 0;
  int64_t count = 1;
  int64_t micro_batches = 1;
  Link* up = nullptr;
  Link* down = nullptr;
  Timeline* timeline = nullptr;
  StageMetrics* metrics = nullptr;
  std::string error;  // first failure, for the test to report
};

// One stage's steps: the shape of Stage::RunStep without the arithmetic.
void RunStage(StageRun& r) {
  auto check = [&r](const absl::Status& s) {
    if (!s.ok() && r.error.empty()) r.error = std::string(s.message());
    return s.ok();
  };
  const std::vector<Op> ops =
      MakeSchedule(ScheduleKind::kGPipe, r.count, r.micro_batches, r.index);
  for (int64_t step = 0; step < kSteps; ++step) {
    r.timeline->BeginStep(step);
    for (const Op& op : ops) {
      if (op.kind == OpKind::kForward) {
        if (r.up != nullptr && !check(r.up->Receive().status())) return;
        OpTimer timer(*r.timeline, Phase::kForward, op.micro_batch);
        std::this_thread::sleep_for(kForward);
        if (r.down != nullptr &&
            !check(r.down->Send(
                Make(MessageKind::kActivation, step, op.micro_batch))))
          return;
      } else if (op.kind == OpKind::kBackward) {
        if (r.down != nullptr && !check(r.down->Receive().status())) return;
        OpTimer timer(*r.timeline, Phase::kBackward, op.micro_batch);
        std::this_thread::sleep_for(kBackward);
        if (r.up != nullptr && !check(r.up->Send(Make(MessageKind::kGradient,
                                                      step, op.micro_batch))))
          return;
      } else {
        // The clipping chain ties the stages' step ends together, as in
        // Stage::OptimizerStep: squares go down, the total comes back up.
        // Waiting for the total is bubble; the op is the update.
        if (r.up != nullptr && !check(r.up->Receive().status())) return;
        Message sq;
        sq.kind = MessageKind::kGradSquares;
        sq.step = step;
        if (r.down != nullptr) {
          if (!check(r.down->Send(sq)) || !check(r.down->Receive().status()))
            return;
        }
        OpTimer timer(*r.timeline, Phase::kOptimizer, -1);
        if (r.up != nullptr && !check(r.up->Send(sq))) return;
        std::this_thread::sleep_for(kOptimizer);
      }
    }
    r.timeline->EndStep();
    StepOutcome report;
    report.completed_steps = step + 1;
    report.samples = 16;
    r.metrics->ObserveStep(r.timeline->LastStep(), report);
  }
}

// The value of `name`{stage="i"} in the registry, or NaN.
double Value(prometheus::Registry& registry, const std::string& name,
             int64_t stage, bool histogram_sum = false) {
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      for (const auto& l : m.label) {
        if (l.name == "stage" && l.value == std::to_string(stage)) {
          if (histogram_sum) return m.histogram.sample_sum;
          return f.type == prometheus::MetricType::Counter ? m.counter.value
                                                           : m.gauge.value;
        }
      }
    }
  }
  return std::nan("");
}

class BalancedPipeline
    : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(BalancedPipeline, BubbleRatioIsCloseToTheory) {
  const auto [k, m] = GetParam();
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  std::vector<std::unique_ptr<Link>> ends;  // [2i]: i's down, [2i+1]: i+1's up
  for (int64_t i = 0; i + 1 < k; ++i) {
    auto [a, b] = MakeInProcessLinkPair(static_cast<size_t>(m) + 4);
    ends.push_back(std::move(a));
    ends.push_back(std::move(b));
  }
  const auto origin = Timeline::Clock::now();
  std::vector<std::unique_ptr<Timeline>> timelines;
  std::vector<std::shared_ptr<StageMetrics>> stage_metrics;
  std::vector<std::unique_ptr<MeteredLink>> metered;
  std::vector<StageRun> runs(k);
  for (int64_t i = 0; i < k; ++i) {
    timelines.push_back(std::make_unique<Timeline>(origin, kSteps));
    stage_metrics.push_back(
        metrics.ForStage("j", i, /*replica=*/0, k, m, i == k - 1));
    StageRun& r = runs[i];
    r.index = i;
    r.count = k;
    r.micro_batches = m;
    r.timeline = timelines.back().get();
    r.metrics = stage_metrics.back().get();
    if (i > 0) {
      metered.push_back(
          std::make_unique<MeteredLink>(ends[2 * i - 1].get(), r.metrics));
      r.up = metered.back().get();
    }
    if (i + 1 < k) {
      metered.push_back(
          std::make_unique<MeteredLink>(ends[2 * i].get(), r.metrics));
      r.down = metered.back().get();
    }
  }
  std::vector<std::thread> threads;
  for (StageRun& r : runs) threads.emplace_back([&r] { RunStage(r); });
  for (std::thread& t : threads) t.join();

  const double theory = TheoreticalBubbleRatio(k, m);
  for (int64_t i = 0; i < k; ++i) {
    ASSERT_EQ(runs[i].error, "") << "stage " << i;
    const std::vector<StepTimeline> steps = timelines[i]->Steps();
    ASSERT_EQ(steps.size(), static_cast<size_t>(kSteps));
    double wall = 0, bubble = 0;
    for (const StepTimeline& s : steps) {
      const StepFigures f = ComputeStepFigures(s);
      // busy + bubble is the step's wall time on the stage.
      EXPECT_NEAR(f.busy_seconds + f.bubble_seconds, f.wall_seconds, 1e-9);
      EXPECT_NEAR(f.utilization_ratio + f.bubble_ratio, 1.0, 1e-9);
      wall += f.wall_seconds;
      bubble += f.bubble_seconds;
    }
    // The exported counters hold the same sums.
    EXPECT_NEAR(Value(registry, "gpipe_stage_bubble_seconds_total", i), bubble,
                1e-6);
    EXPECT_NEAR(Value(registry, "gpipe_step_duration_seconds", i, true), wall,
                1e-6);
    EXPECT_DOUBLE_EQ(
        Value(registry, "gpipe_pipeline_bubble_theoretical_ratio", i), theory);
    const double transport_share =
        Value(registry, "gpipe_transport_send_duration_seconds", i, true) /
        wall;
    const double measured = bubble / wall;
    std::printf(
        "K=%lld M=%lld stage %lld: bubble %.4f, theory %.4f, "
        "transport share %.4f\n",
        static_cast<long long>(k), static_cast<long long>(m),
        static_cast<long long>(i), measured, theory, transport_share);
    EXPECT_NEAR(measured, theory, 0.05 + transport_share)
        << "K=" << k << " M=" << m << " stage " << i << ": measured "
        << measured << ", theory " << theory << ", transport share "
        << transport_share;
    // The last step's ratio is exported as it was measured.
    const StepFigures last = ComputeStepFigures(steps.back());
    EXPECT_DOUBLE_EQ(Value(registry, "gpipe_stage_bubble_ratio", i),
                     last.bubble_ratio);
  }
}

INSTANTIATE_TEST_SUITE_P(GPipe, BalancedPipeline,
                         ::testing::Values(std::make_pair(2, 4),
                                           std::make_pair(2, 16),
                                           std::make_pair(4, 4),
                                           std::make_pair(4, 16)),
                         [](const auto& info) {
                           return "K" + std::to_string(info.param.first) + "M" +
                                  std::to_string(info.param.second);
                         });

}  // namespace
}  // namespace gpipe
