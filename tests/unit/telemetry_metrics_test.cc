// The metric arithmetic (busy, bubble, ratios, theory), the families a stage
// and the controller export, the bound on label sets over many jobs, the
// metered link, and the /metrics endpoint over real HTTP on loopback.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "services/telemetry/controller_metrics.h"
#include "services/telemetry/metered_link.h"
#include "services/telemetry/metrics_server.h"
#include "services/telemetry/stage_metrics.h"
#include "services/telemetry/step_figures.h"
#include "services/transport/in_process_link.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

OpRecord Op(Phase phase, int64_t m, int64_t start_ms, int64_t end_ms) {
  return OpRecord{phase, m, start_ms * 1000000, end_ms * 1000000};
}

StepTimeline Step(int64_t wall_ms, std::vector<OpRecord> ops) {
  StepTimeline t;
  t.step = 3;
  t.start_ns = 0;
  t.end_ns = wall_ms * 1000000;
  t.ops = std::move(ops);
  return t;
}

TEST(StepFigures, BusyByPhaseBubbleAndRatios) {
  const StepFigures f = ComputeStepFigures(Step(
      100, {Op(Phase::kForward, 0, 10, 20), Op(Phase::kForward, 1, 20, 30),
            Op(Phase::kRecompute, 0, 50, 55), Op(Phase::kBackward, 0, 55, 75),
            Op(Phase::kOptimizer, -1, 90, 95)}));
  EXPECT_NEAR(f.wall_seconds, 0.100, 1e-12);
  EXPECT_NEAR(f.busy_by_phase[static_cast<int>(Phase::kForward)], 0.020, 1e-12);
  EXPECT_NEAR(f.busy_by_phase[static_cast<int>(Phase::kRecompute)], 0.005,
              1e-12);
  EXPECT_NEAR(f.busy_by_phase[static_cast<int>(Phase::kBackward)], 0.020,
              1e-12);
  EXPECT_NEAR(f.busy_by_phase[static_cast<int>(Phase::kOptimizer)], 0.005,
              1e-12);
  EXPECT_NEAR(f.busy_seconds, 0.050, 1e-12);
  EXPECT_NEAR(f.bubble_seconds, 0.050, 1e-12);
  EXPECT_NEAR(f.utilization_ratio, 0.5, 1e-12);
  EXPECT_NEAR(f.bubble_ratio, 0.5, 1e-12);
}

TEST(StepFigures, NeverNegativeNorAboveOne) {
  // Clock reads at the edges can make busy a hair longer than the step.
  StepFigures f = ComputeStepFigures(Step(10, {Op(Phase::kForward, 0, 0, 11)}));
  EXPECT_EQ(f.bubble_seconds, 0.0);
  EXPECT_EQ(f.utilization_ratio, 1.0);
  EXPECT_EQ(f.bubble_ratio, 0.0);
  f = ComputeStepFigures(StepTimeline());  // before the first step
  EXPECT_EQ(f.wall_seconds, 0.0);
  EXPECT_EQ(f.utilization_ratio, 0.0);
  EXPECT_EQ(f.bubble_ratio, 0.0);
}

TEST(StepFigures, TheoreticalBubble) {
  EXPECT_EQ(TheoreticalBubbleRatio(1, 8), 0.0);
  EXPECT_DOUBLE_EQ(TheoreticalBubbleRatio(2, 4), 1.0 / 5);
  EXPECT_DOUBLE_EQ(TheoreticalBubbleRatio(4, 4), 3.0 / 7);
  EXPECT_DOUBLE_EQ(TheoreticalBubbleRatio(4, 16), 3.0 / 19);
  EXPECT_EQ(TheoreticalBubbleRatio(4, 0), 0.0);
}

// Finds `name` with labels job=`job`, stage=`stage`, replica=`replica` (and
// phase when given).
const prometheus::ClientMetric* Find(
    const std::vector<prometheus::MetricFamily>& families,
    const std::string& name, const std::string& job, const std::string& stage,
    const std::string& phase = "", const std::string& replica = "0") {
  for (const auto& f : families) {
    if (f.name != name) continue;
    for (const auto& m : f.metric) {
      bool j = false, s = false, r = false, p = phase.empty();
      for (const auto& l : m.label) {
        j |= l.name == "job" && l.value == job;
        s |= l.name == "stage" && l.value == stage;
        r |= l.name == "replica" && l.value == replica;
        p |= l.name == "phase" && l.value == phase;
      }
      if (j && s && r && p) return &m;
    }
  }
  return nullptr;
}

TEST(StageMetrics, AStepLandsInEveryFamily) {
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  auto last = metrics.ForStage("job-1", 1, /*replica=*/0, 2, 4, /*last=*/true);
  StepOutcome report;
  report.completed_steps = 4;
  report.samples = 32;
  report.peak_activation_bytes = 1000;
  report.loss = 0.75;
  last->ObserveStep(Step(100, {Op(Phase::kForward, 0, 0, 30),
                               Op(Phase::kBackward, 0, 40, 80)}),
                    report);
  report.peak_activation_bytes = 600;  // the peak stays the peak
  last->ObserveStep(Step(50, {Op(Phase::kForward, 0, 0, 25)}), report);
  last->ObserveSend(4096, 0.002);
  last->ObserveReceive(2048);

  const auto f = registry.Collect();
  auto value = [&](const char* name, const char* phase = "") {
    const prometheus::ClientMetric* m = Find(f, name, "job-1", "1", phase);
    EXPECT_NE(m, nullptr) << name << " " << phase;
    return m;
  };
  EXPECT_NEAR(value("gpipe_stage_busy_seconds_total", "forward")->counter.value,
              0.055, 1e-9);
  EXPECT_NEAR(
      value("gpipe_stage_busy_seconds_total", "backward")->counter.value, 0.040,
      1e-9);
  EXPECT_EQ(value("gpipe_stage_busy_seconds_total", "recompute")->counter.value,
            0.0);
  EXPECT_NEAR(value("gpipe_stage_bubble_seconds_total")->counter.value,
              0.030 + 0.025, 1e-9);
  EXPECT_NEAR(value("gpipe_stage_utilization_ratio")->gauge.value, 0.5, 1e-9);
  EXPECT_NEAR(value("gpipe_stage_bubble_ratio")->gauge.value, 0.5, 1e-9);
  EXPECT_DOUBLE_EQ(
      value("gpipe_pipeline_bubble_theoretical_ratio")->gauge.value, 0.2);
  EXPECT_EQ(value("gpipe_microbatch_duration_seconds", "forward")
                ->histogram.sample_count,
            2u);
  EXPECT_EQ(value("gpipe_step_duration_seconds")->histogram.sample_count, 2u);
  EXPECT_EQ(value("gpipe_samples_total")->counter.value, 64);
  EXPECT_EQ(value("gpipe_loss")->gauge.value, 0.75);
  EXPECT_EQ(value("gpipe_job_step")->gauge.value, 4);
  EXPECT_EQ(value("gpipe_stage_activation_memory_bytes")->gauge.value, 1000);
  EXPECT_EQ(value("gpipe_transport_sent_bytes_total")->counter.value, 4096);
  EXPECT_EQ(value("gpipe_transport_received_bytes_total")->counter.value, 2048);
  EXPECT_EQ(
      value("gpipe_transport_send_duration_seconds")->histogram.sample_count,
      1u);
  // No step or micro-batch labels, ever.
  for (const auto& family : f)
    for (const auto& m : family.metric)
      for (const auto& l : m.label)
        EXPECT_THAT(l.name,
                    ::testing::AnyOf("job", "stage", "replica", "phase"));
}

// A stage that restores step 250 says so before its first step completes:
// its step gauge read 0 until then, and the Step panel dipped to 0 at every
// restart.
TEST(StageMetrics, TheStepGaugeStartsAtTheRestoredStep) {
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  auto stage = metrics.ForStage("job-1", 1, /*replica=*/0, 2, 4, true);
  stage->StartAt(250);
  const auto families = registry.Collect();
  const prometheus::ClientMetric* step =
      Find(families, "gpipe_job_step", "job-1", "1", "");
  ASSERT_NE(step, nullptr);
  EXPECT_EQ(step->gauge.value, 250.0);
}

// A chunk of an interleaved schedule shares its worker's thread: the time
// that thread computes its other chunks is not the chunk's bubble, its
// utilization is its worker's too (the two add up to 1, and a job's mean
// utilization is its workers'), and the theory is interleaved 1F1B's over
// the K workers, not 1F1B's over K x v.
TEST(StageMetrics, AChunksBubbleIsItsWorkersAndItsTheoryInterleaved) {
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  auto chunk = metrics.ForStage("j", 2, /*replica=*/0, /*stages=*/4,
                                /*micro_batches=*/4, /*last=*/false,
                                ScheduleKind::kInterleaved1F1B,
                                /*virtual_stages=*/2);
  StepOutcome report;
  report.other_stages_busy_seconds = 0.040;  // its sibling chunk's
  chunk->ObserveStep(Step(100, {Op(Phase::kForward, 0, 0, 30),
                                Op(Phase::kBackward, 0, 40, 60)}),
                     report);
  const auto f = registry.Collect();
  auto value = [&](const char* name) {
    const prometheus::ClientMetric* m = Find(f, name, "j", "2", "");
    EXPECT_NE(m, nullptr) << name;
    return m;
  };
  EXPECT_NEAR(value("gpipe_stage_utilization_ratio")->gauge.value, 0.9, 1e-9);
  EXPECT_NEAR(value("gpipe_stage_bubble_ratio")->gauge.value, 0.1, 1e-9);
  EXPECT_NEAR(value("gpipe_stage_bubble_seconds_total")->counter.value, 0.010,
              1e-9);
  // (K-1)/(vM+K-1) with K=2 workers, v=2, M=4.
  EXPECT_NEAR(value("gpipe_pipeline_bubble_theoretical_ratio")->gauge.value,
              1.0 / 9, 1e-9);
}

// The replicas of a stage are series of their own (Prometheus would add
// their counters otherwise), each with its gradient reduction's figures.
TEST(StageMetrics, ReplicasOfAStageAreSeparateSeriesWithTheirReduction) {
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  auto r0 = metrics.ForStage("j", 1, /*replica=*/0, 2, 4, /*last=*/true);
  auto r1 = metrics.ForStage("j", 1, /*replica=*/1, 2, 4, /*last=*/true);
  ASSERT_NE(r0, r1);
  EXPECT_EQ(metrics.ForStage("j", 1, /*replica=*/1, 2, 4, true), r1);
  r0->ObserveStep(Step(10, {}), StepOutcome{1, 16, 0, 0.25});
  r1->ObserveStep(Step(10, {}), StepOutcome{1, 16, 0, 0.5});
  r1->ObserveReduction(0.003, 4096);
  r1->ObserveReduction(0.002, 1024);
  r1->ObserveReduction(-1, -1);  // a clock read gone wrong adds nothing
  r1->SetDataPlane("shm");
  const auto f = registry.Collect();
  auto value = [&](const char* name, const char* replica) {
    const prometheus::ClientMetric* m = Find(f, name, "j", "1", "", replica);
    EXPECT_NE(m, nullptr) << name << " replica " << replica;
    return m;
  };
  EXPECT_EQ(value("gpipe_loss", "0")->gauge.value, 0.25);
  EXPECT_EQ(value("gpipe_loss", "1")->gauge.value, 0.5);
  EXPECT_EQ(value("gpipe_samples_total", "1")->counter.value, 16);
  EXPECT_NEAR(value("gpipe_stage_allreduce_seconds_total", "1")->counter.value,
              0.005, 1e-12);
  EXPECT_EQ(value("gpipe_stage_allreduce_bytes_total", "1")->counter.value,
            5120);
  EXPECT_EQ(value("gpipe_stage_allreduce_bytes_total", "0")->counter.value, 0);
  EXPECT_EQ(value("gpipe_transport_data_plane", "1")->gauge.value, 1);
  // Ending one replica's assignment leaves the other's series alone.
  metrics.Finish("j", 1, /*replica=*/1);
  EXPECT_EQ(metrics.ForStage("j", 1, /*replica=*/0, 2, 4, true), r0);
}

// The cost model's bubble for the cut a worker runs: absent until the
// assignment gives one, then a series of its own that goes with the stage.
TEST(StageMetrics, ThePredictedBubbleIsExportedOnceGivenAndGoesWithTheStage) {
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  auto m = metrics.ForStage("j", 1, /*replica=*/0, 2, 4, /*last=*/true);
  EXPECT_EQ(
      Find(registry.Collect(), "gpipe_stage_bubble_predicted_ratio", "j", "1"),
      nullptr);
  m->SetPredictedBubble(0.4);
  m->SetPredictedBubble(0.35);
  const auto f = registry.Collect();
  const prometheus::ClientMetric* p =
      Find(f, "gpipe_stage_bubble_predicted_ratio", "j", "1");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->gauge.value, 0.35);
  metrics.Finish("j", 1, /*replica=*/0, /*completed=*/false);
  EXPECT_EQ(
      Find(registry.Collect(), "gpipe_stage_bubble_predicted_ratio", "j", "1"),
      nullptr);
}

TEST(StageMetrics, OnlyTheLastStageExportsTheLoss) {
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  metrics.ForStage("j", 0, /*replica=*/0, 2, 4, /*last=*/false)
      ->ObserveStep(Step(10, {}), StepOutcome{1, 8, 0, 1.5});
  EXPECT_EQ(Find(registry.Collect(), "gpipe_loss", "j", "0"), nullptr);
}

TEST(StageMetrics, LabelSetsOfEndedJobsStayBounded) {
  prometheus::Registry registry;
  PipelineMetrics metrics(registry, /*keep_finished=*/2);
  for (int job = 0; job < 50; ++job) {
    const std::string id = "job-" + std::to_string(job);
    metrics.ForStage(id, 0, /*replica=*/0, 2, 4, false)
        ->ObserveStep(Step(10, {}), {});
    metrics.Finish(id, 0);
  }
  EXPECT_EQ(metrics.exported(), 2u);
  for (const auto& f : registry.Collect()) {
    if (f.name == "gpipe_stage_busy_seconds_total") {
      EXPECT_EQ(f.metric.size(), 2u * kPhaseCount);
    } else if (f.name == "gpipe_stage_bubble_seconds_total") {
      EXPECT_EQ(f.metric.size(), 2u);
    }
  }
  // The newest ended jobs are the ones kept, so their final values are
  // still scraped.
  EXPECT_NE(Find(registry.Collect(), "gpipe_job_step", "job-49", "0"), nullptr);
  EXPECT_EQ(Find(registry.Collect(), "gpipe_job_step", "job-0", "0"), nullptr);
  // Past the linger time the ended ones go; a live one stays.
  metrics.ForStage("live", 1, /*replica=*/0, 2, 4, false);
  metrics.Prune(PipelineMetrics::Clock::now() + std::chrono::hours(1));
  EXPECT_EQ(metrics.exported(), 1u);
  EXPECT_EQ(Find(registry.Collect(), "gpipe_job_step", "job-49", "0"), nullptr);
  EXPECT_NE(Find(registry.Collect(), "gpipe_job_step", "live", "1"), nullptr);
  // A stage reassigned to the same worker continues its series while they
  // are exported.
  metrics.Finish("live", 1);
  auto again = metrics.ForStage("live", 1, /*replica=*/0, 2, 4, false);
  again->ObserveStep(Step(10, {}), {});
  again->ObserveStep(Step(10, {}), {});
  EXPECT_EQ(Find(registry.Collect(), "gpipe_step_duration_seconds", "live", "1")
                ->histogram.sample_count,
            2u);
}

TEST(StageMetrics, AStageMovedAwayLeavesNoSeriesBehind) {
  // A re-partition moved stage 0 of job j off this worker, which now runs
  // stage 1: stage 0's series go at once (they stayed, frozen, beside the
  // new worker's, until the job ended); another job's are untouched.
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  metrics.ForStage("j", 0, /*replica=*/0, 2, 4, false)
      ->ObserveStep(Step(10, {}), {});
  metrics.ForStage("other", 0, /*replica=*/0, 2, 4, false);
  metrics.KeepOnly("j", {{1, 0}});
  metrics.ForStage("j", 1, /*replica=*/0, 2, 4, true);
  EXPECT_EQ(Find(registry.Collect(), "gpipe_job_step", "j", "0"), nullptr);
  EXPECT_NE(Find(registry.Collect(), "gpipe_job_step", "j", "1"), nullptr);
  EXPECT_NE(Find(registry.Collect(), "gpipe_job_step", "other", "0"), nullptr);
  EXPECT_EQ(metrics.exported(), 2u);
}

TEST(StageMetrics, AFailedOrCancelledStageLeavesNoSeriesBehind) {
  // The stage runs again on another worker (or its job ended): frozen
  // here beside the new worker's series, it made two series of one stage
  // for a minute. A completed stage keeps its final values a while.
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  metrics.ForStage("j", 1, /*replica=*/0, 2, 4, true)
      ->ObserveStep(Step(10, {}), StepOutcome{1, 8, 0, 0.5});
  metrics.ForStage("done", 0, /*replica=*/0, 2, 4, false)
      ->ObserveStep(Step(10, {}), {});
  metrics.Finish("j", 1, /*replica=*/0, /*completed=*/false);
  metrics.Finish("done", 0, /*replica=*/0, /*completed=*/true);
  EXPECT_EQ(Find(registry.Collect(), "gpipe_job_step", "j", "1"), nullptr);
  EXPECT_EQ(Find(registry.Collect(), "gpipe_loss", "j", "1"), nullptr);
  EXPECT_NE(Find(registry.Collect(), "gpipe_job_step", "done", "0"), nullptr);
  EXPECT_EQ(metrics.exported(), 1u);
}

TEST(MeteredLink, CountsTensorBytesBothWays) {
  prometheus::Registry registry;
  PipelineMetrics metrics(registry);
  auto down = metrics.ForStage("j", 0, /*replica=*/0, 2, 1, false);
  auto up = metrics.ForStage("j", 1, /*replica=*/0, 2, 1, true);
  auto [a, b] = MakeInProcessLinkPair(4);
  MeteredLink ma(a.get(), down.get()), mb(b.get(), up.get());
  Message msg;
  msg.tensor = Tensor::Zeros(Shape({3, 5}));
  ASSERT_TRUE(ma.Send(msg).ok());
  Message scalar;
  scalar.kind = MessageKind::kGradSquares;
  ASSERT_TRUE(ma.Send(scalar).ok());  // no tensor: no bytes
  ASSERT_TRUE(mb.Receive().ok());
  ASSERT_TRUE(mb.Receive().ok());
  const auto f = registry.Collect();
  EXPECT_EQ(
      Find(f, "gpipe_transport_sent_bytes_total", "j", "0")->counter.value, 60);
  EXPECT_EQ(
      Find(f, "gpipe_transport_received_bytes_total", "j", "1")->counter.value,
      60);
  EXPECT_EQ(Find(f, "gpipe_transport_send_duration_seconds", "j", "0")
                ->histogram.sample_count,
            2u);
}

TEST(ControllerMetrics, StatesAndCountersAreAlwaysExported) {
  ControllerMetrics metrics;
  auto names = [&] {
    std::vector<std::string> n;
    for (const auto& f : metrics.Collect()) n.push_back(f.name);
    return n;
  };
  EXPECT_THAT(names(),
              ::testing::IsSupersetOf({"gpipe_jobs", "gpipe_workers",
                                       "gpipe_checkpoints_total",
                                       "gpipe_recovery_duration_seconds"}));
  // A job's counters from its submit on, at 0.
  metrics.OnJob("j");
  EXPECT_THAT(names(),
              ::testing::IsSupersetOf({"gpipe_job_restarts_total",
                                       "gpipe_checkpoint_failures_total"}));
  metrics.SetCounts([] {
    ClusterCounts c;
    c.jobs = {{"RUNNING", 2}, {"FAILED", 0}};
    c.workers = {{"IDLE", 1}, {"BUSY", 4}};
    return c;
  });
  metrics.OnRestart("j");
  metrics.ObserveRecovery(3.5);
  for (const auto& f : metrics.Collect()) {
    if (f.name == "gpipe_jobs") {
      ASSERT_EQ(f.metric.size(), 2u);
      EXPECT_EQ(f.metric[1].label[0].value, "RUNNING");
      EXPECT_EQ(f.metric[1].gauge.value, 2);
    } else if (f.name == "gpipe_workers") {
      ASSERT_EQ(f.metric.size(), 2u);
    } else if (f.name == "gpipe_job_restarts_total") {
      ASSERT_EQ(f.metric.size(), 1u);
      EXPECT_EQ(f.metric[0].label[0].value, "j");
      EXPECT_EQ(f.metric[0].counter.value, 1);
    } else if (f.name == "gpipe_checkpoint_failures_total") {
      // Every reason from the job's start, at 0: Prometheus' increase()
      // misses the first failure of a series born at 1.
      ASSERT_EQ(f.metric.size(), 3u);
      for (const auto& m : f.metric) EXPECT_EQ(m.counter.value, 0);
    } else if (f.name == "gpipe_recovery_duration_seconds") {
      EXPECT_EQ(f.metric[0].histogram.sample_count, 1u);
    }
  }
}

// A deleted job's series go with it; another job's stay.
TEST(ControllerMetrics, AForgottenJobsSeriesAreDropped) {
  ControllerMetrics metrics;
  for (const std::string job : {"job-a", "job-b"}) {
    metrics.OnJob(job);
    metrics.OnRestart(job);
    metrics.OnCheckpointFailure(job, "store_full");
    metrics.ObserveLoss(job, 0.5);
    metrics.ObserveEvaluation(job, 0.4, 0.9);
    metrics.ObserveStepTime(job, 0.1, 0.2);
  }
  metrics.ForgetJob("job-a");
  metrics.ForgetJob("job-never");
  int series = 0;
  for (const auto& f : metrics.Collect()) {
    for (const auto& m : f.metric) {
      for (const auto& l : m.label) {
        if (l.name != "job") continue;
        EXPECT_EQ(l.value, "job-b") << f.name;
        ++series;
      }
    }
  }
  // Loss, eval loss and accuracy, both step times, restarts and the three
  // reasons of failed checkpoints.
  EXPECT_EQ(series, 9);
}

// A finished job's step times go; its loss and evaluation stay.
TEST(ControllerMetrics, AnEndedJobKeepsItsLossButNotItsStepTimes) {
  ControllerMetrics metrics;
  metrics.ObserveLoss("j", 0.5);
  metrics.ObserveEvaluation("j", 0.4, 0.9);
  metrics.ObserveStepTime("j", 0.1, 0.2);
  metrics.OnJobEnded("j");
  std::vector<std::string> left;
  for (const auto& f : metrics.Collect()) {
    for (const auto& m : f.metric) {
      for (const auto& l : m.label)
        if (l.name == "job") left.push_back(f.name);
    }
  }
  EXPECT_THAT(
      left, ::testing::UnorderedElementsAre("gpipe_job_loss", "gpipe_eval_loss",
                                            "gpipe_eval_accuracy"));
}

// Sends `request` to 127.0.0.1:port with a plain socket; the whole reply.
std::string Ask(int port, const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  (void)!write(fd, request.data(), request.size());
  shutdown(fd, SHUT_WR);
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;)
    response.append(buf, n);
  close(fd);
  return response;
}

std::string Scrape(int port) {
  return Ask(port, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
}

TEST(MetricsServer, AnswersBadRequestsAndKeepsServing) {
  prometheus::Registry registry;
  auto metrics = std::make_shared<PipelineMetrics>(registry);
  auto server = MetricsServer::Start("127.0.0.1:0", {metrics});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_THAT(Ask(port, "GET / HTTP/1.0\r\n\r\n"), HasSubstr("404"));
  EXPECT_THAT(Ask(port, "POST /metrics HTTP/1.0\r\n\r\n"), HasSubstr("405"));
  EXPECT_THAT(Ask(port, std::string(40000, 'x')), HasSubstr("431"));
  EXPECT_EQ(Ask(port, "GET /metr"), "");  // cut off: closed without a reply
  std::string noise;
  for (int i = 0; i < 300; ++i) noise.push_back(static_cast<char>(i * 37));
  Ask(port, noise + "\r\n\r\n");
  EXPECT_THAT(Scrape(port), HasSubstr("200 OK"));
}

// Clients that never finish their request do not hold a scrape off: they
// were read one at a time, each for up to 2 s, so 50 of them kept every
// scrape waiting for 100 s.
TEST(MetricsServer, AScrapeIsAnsweredBesideStalledClients) {
  prometheus::Registry registry;
  auto metrics = std::make_shared<PipelineMetrics>(registry);
  auto server = MetricsServer::Start("127.0.0.1:0", {metrics});
  ASSERT_TRUE(server.ok()) << server.status();
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>((*server)->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> stalled;
  for (int i = 0; i < 50; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string start = "GET /metrics HTTP/1.1\r\n";
    ASSERT_EQ(write(fd, start.data(), start.size()),
              static_cast<ssize_t>(start.size()));
    stalled.push_back(fd);
  }
  // Well under the 50 x 2 s the clients would have taken in turn.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval limit = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string scrape = "GET /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(write(fd, scrape.data(), scrape.size()),
            static_cast<ssize_t>(scrape.size()));
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;)
    response.append(buf, n);
  close(fd);
  EXPECT_THAT(response, HasSubstr("200 OK"));
  for (int s : stalled) close(s);
}

TEST(MetricsServer, ServesOnAFreeLoopbackPort) {
  prometheus::Registry registry;
  auto metrics = std::make_shared<PipelineMetrics>(registry);
  metrics->ForStage("job-7", 2, /*replica=*/0, 4, 8, true)
      ->ObserveStep(Step(10, {}), {});
  auto server = MetricsServer::Start("127.0.0.1:0", {metrics});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->address(),
            "127.0.0.1:" + std::to_string((*server)->port()));
  const std::string text = Scrape((*server)->port());
  EXPECT_THAT(text, HasSubstr("200 OK"));
  EXPECT_THAT(text,
              HasSubstr("gpipe_pipeline_bubble_theoretical_ratio{job=\"job-7\","
                        "replica=\"0\",stage=\"2\"} 0.2727"));
  // The port is taken now: a clear Unavailable, no exception.
  auto again = MetricsServer::Start((*server)->address(), {metrics});
  EXPECT_TRUE(absl::IsUnavailable(again.status())) << again.status();
}

// The exposition format spells a NaN sample "NaN" (prometheus-cpp wrote
// "Nan", which stricter parsers than Prometheus's refuse); a label value
// that reads Nan is left as it is.
TEST(MetricsServer, WritesNaNAsTheFormatSpellsIt) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family = prometheus::BuildGauge()
                     .Name("gpipe_test_value")
                     .Help("a test gauge")
                     .Register(*registry);
  family.Add({{"job", "Nan"}}).Set(std::nan(""));
  family.Add({{"job", "inf"}}).Set(std::numeric_limits<double>::infinity());
  family.Add({{"job", "one"}}).Set(1.5);
  auto server = MetricsServer::Start("127.0.0.1:0", {registry});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string text = Scrape((*server)->port());
  EXPECT_THAT(text, HasSubstr("gpipe_test_value{job=\"Nan\"} NaN\n"));
  EXPECT_THAT(text, HasSubstr("gpipe_test_value{job=\"inf\"} +Inf\n"));
  EXPECT_THAT(text, HasSubstr("gpipe_test_value{job=\"one\"} 1.5\n"));
  EXPECT_THAT(text, Not(HasSubstr(" Nan\n")));
}

TEST(MetricsServer, RejectsMalformedAddresses) {
  for (const char* bad : {"9464", ":9464", "127.0.0.1:", "127.0.0.1:http",
                          "127.0.0.1:70000", "127.0.0.1:-1"}) {
    const absl::Status s = CheckListenAddress("metrics_listen", bad);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("--metrics_listen"));
    EXPECT_TRUE(
        absl::IsInvalidArgument(MetricsServer::Start(bad, {}).status()));
  }
  EXPECT_TRUE(CheckListenAddress("m", "0.0.0.0:0").ok());
  EXPECT_TRUE(CheckListenAddress("m", "[::1]:9464").ok());
}

}  // namespace
}  // namespace gpipe
