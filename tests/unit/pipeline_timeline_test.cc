// Each stage's timeline: every op of the schedule recorded with its phase,
// recomputes under re-materialization, bytes moved, and busy + bubble adding
// up to the step's wall time on that stage.
#include "gtest/gtest.h"
#include "services/pipeline/in_process_pipeline.h"
#include "services/pipeline/job_spec.h"

namespace gpipe {
namespace {

constexpr char kSpec[] = R"json({
  "model": {
    "input": {"dtype": "FLOAT32", "shape": {"dims": [16]}},
    "layers": [
      {"linear": {"inFeatures": 16, "outFeatures": 32}}, {"relu": {}},
      {"linear": {"inFeatures": 32, "outFeatures": 32}}, {"relu": {}},
      {"linear": {"inFeatures": 32, "outFeatures": 4}}
    ],
    "loss": {"softmaxCrossEntropy": {}}
  },
  "optimizer": {"lr": 0.01, "sgd": {}},
  "data": {"synthetic": {"task": "CLASSES", "features": 16, "classes": 4,
                         "trainSamples": 256, "testSamples": 32}},
  "batchSize": 24, "steps": 4, "seed": 5
})json";

TEST(PipelineTimeline, RecordsEveryOpAndAccountsForTheWholeStep) {
  auto spec = ParseJobSpecJson(kSpec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  PipelineOptions o;
  o.stages = 3;
  o.micro_batches = 4;
  o.schedule = ScheduleKind::kOneFOneB;
  o.remat = RematMode::kExceptLast;
  o.balance = {2, 2, 1};
  auto p = InProcessPipeline::Create(*spec, o);
  ASSERT_TRUE(p.ok()) << p.status();
  for (int s = 0; s < 3; ++s) ASSERT_TRUE((*p)->Step().ok());
  for (int64_t i = 0; i < 3; ++i) {
    const std::vector<StepTimeline> steps = (*p)->stage(i).timeline().Steps();
    ASSERT_EQ(steps.size(), 3u);
    const StepTimeline& t = steps.back();
    EXPECT_EQ(t.step, 2);
    int forwards = 0, backwards = 0, recomputes = 0, optimizers = 0;
    int64_t sent = 0, received = 0, previous_end = t.start_ns;
    for (const OpRecord& op : t.ops) {
      forwards += op.phase == Phase::kForward;
      backwards += op.phase == Phase::kBackward;
      recomputes += op.phase == Phase::kRecompute;
      optimizers += op.phase == Phase::kOptimizer;
      sent += op.bytes_sent;
      received += op.bytes_received;
      EXPECT_LE(op.start_ns, op.end_ns);
      EXPECT_GE(op.start_ns, previous_end);  // one op at a time, in order
      previous_end = op.end_ns;
    }
    EXPECT_LE(previous_end, t.end_ns);
    EXPECT_EQ(forwards, 4);
    EXPECT_EQ(backwards, 4);
    EXPECT_EQ(optimizers, 1);
    EXPECT_EQ(recomputes, i < 2 ? 4 : 0) << "stage " << i;  // except_last
    // Stage 0 sends 24 rows of 32 floats down and receives their gradients.
    if (i == 0) {
      EXPECT_EQ(sent, 24 * 32 * 4);
      EXPECT_EQ(received, 24 * 32 * 4);
    }
    EXPECT_GT(t.busy_seconds(), 0);
    EXPECT_GE(t.bubble_seconds(), 0);
    EXPECT_NEAR(t.busy_seconds() + t.bubble_seconds(), t.wall_seconds(), 1e-12);
    EXPECT_NEAR(t.busy_seconds(),
                t.busy_seconds(Phase::kForward) +
                    t.busy_seconds(Phase::kBackward) +
                    t.busy_seconds(Phase::kRecompute) +
                    t.busy_seconds(Phase::kOptimizer),
                1e-9);
  }
}

TEST(PipelineTimeline, KeepsABoundedNumberOfSteps) {
  Timeline t(Timeline::Clock::now(), 2);
  for (int s = 0; s < 5; ++s) {
    t.BeginStep(s);
    t.Record({Phase::kForward, 0, t.Now(), t.Now()});
    t.EndStep();
  }
  const auto steps = t.Steps();
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step, 3);
  EXPECT_EQ(t.LastStep().step, 4);
}

TEST(InProcessPipeline, ClearErrors) {
  auto spec = ParseJobSpecJson(kSpec);
  ASSERT_TRUE(spec.ok());
  PipelineOptions o;
  o.stages = 6;
  auto p = InProcessPipeline::Create(*spec, o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(
      std::string(p.status().message()).find("more than the model's 5 layers"),
      std::string::npos)
      << p.status();
  o.stages = 2;
  o.balance = {2, 2};
  p = InProcessPipeline::Create(*spec, o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("adding up to 5"),
            std::string::npos)
      << p.status();
  o.balance = {};
  o.micro_batches = 25;
  p = InProcessPipeline::Create(*spec, o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(std::string(p.status().message()).find("larger than batch_size 24"),
            std::string::npos)
      << p.status();
}

}  // namespace
}  // namespace gpipe
