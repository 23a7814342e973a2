// The controller's bounded store of stage timelines, and GetTrace's answers
// to bad requests.
#include <string>

#include "absl/status/status.h"
#include "controller/controller.h"
#include "controller/trace_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/pipeline/job_spec.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;
using ::testing::HasSubstr;

v1::StepTrace Record(const std::string& job, int64_t stage, int64_t step,
                     int64_t epoch = 1) {
  v1::StepTrace t;
  t.set_job_id(job);
  t.set_epoch(epoch);
  t.set_stage(stage);
  t.set_step(step);
  t.set_start_unix_ns(step * 1000);
  t.set_end_unix_ns(step * 1000 + 900);
  v1::OpTrace* op = t.add_ops();
  op->set_phase(v1::OpTrace::FORWARD);
  op->set_start_unix_ns(step * 1000 + 10);
  op->set_end_unix_ns(step * 1000 + 20);
  return t;
}

TEST(TraceStoreTest, KeepsTheLastStepsOfEachStage) {
  TraceStore store(/*keep_steps=*/3, /*keep_jobs=*/4);
  for (int64_t step = 0; step < 10; ++step) {
    for (int64_t stage = 0; stage < 2; ++stage)
      store.Add(Record("job-a", stage, step));
  }
  absl::StatusOr<v1::GetTraceResponse> all =
      store.Get("job-a", std::nullopt, std::nullopt);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->first_stored_step(), 7);
  EXPECT_EQ(all->last_stored_step(), 9);
  ASSERT_EQ(all->steps_size(), 6);
  // By step, then stage.
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(all->steps(i).step(), 7 + i / 2);
    EXPECT_EQ(all->steps(i).stage(), i % 2);
  }
  absl::StatusOr<v1::GetTraceResponse> one = store.Get("job-a", 8, 8);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->steps_size(), 2);
  absl::StatusOr<v1::GetTraceResponse> from =
      store.Get("job-a", 9, std::nullopt);
  ASSERT_TRUE(from.ok());
  EXPECT_EQ(from->steps_size(), 2);
  // A range that overlaps the kept steps returns what is kept.
  absl::StatusOr<v1::GetTraceResponse> partial = store.Get("job-a", 0, 7);
  ASSERT_TRUE(partial.ok());
  EXPECT_EQ(partial->steps_size(), 2);
}

TEST(TraceStoreTest, KeepsEachReplicaOfAStageApart) {
  TraceStore store(/*keep_steps=*/2, /*keep_jobs=*/4);
  for (int64_t step = 0; step < 3; ++step) {
    for (int64_t replica : {1, 0}) {
      for (int64_t stage = 0; stage < 2; ++stage) {
        v1::StepTrace t = Record("j", stage, step);
        t.set_replica(replica);
        store.Add(t);
      }
    }
  }
  absl::StatusOr<v1::GetTraceResponse> all =
      store.Get("j", std::nullopt, std::nullopt);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->steps_size(), 8);  // 2 steps x 2 replicas x 2 stages
  // By step, then replica, then stage.
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(all->steps(i).step(), 1 + i / 4);
    EXPECT_EQ(all->steps(i).replica(), (i / 2) % 2);
    EXPECT_EQ(all->steps(i).stage(), i % 2);
  }
}

// A replica the job shrank away stops reporting: once the others are a
// window past its last step, its track goes.
TEST(TraceStoreTest, AStoppedTrackGoesAWindowLater) {
  TraceStore store(/*keep_steps=*/2, /*keep_jobs=*/4);
  for (int64_t step = 0; step < 8; ++step) {
    for (int64_t replica = 0; replica < (step < 3 ? 2 : 1); ++replica) {
      v1::StepTrace t = Record("j", 0, step);
      t.set_replica(replica);
      store.Add(t);
    }
    absl::StatusOr<v1::GetTraceResponse> all =
        store.Get("j", std::nullopt, std::nullopt);
    ASSERT_TRUE(all.ok()) << all.status();
    bool replica_1 = false;
    for (const v1::StepTrace& t : all->steps()) replica_1 |= t.replica() == 1;
    // Replica 1's last step is 2: kept while the newest is at most 4.
    EXPECT_EQ(replica_1, step <= 4) << "after step " << step;
    // The oldest kept: replica 1's step 1 while it stays, else replica 0's
    // window.
    const int64_t want_first = step <= 1 ? 0 : step <= 4 ? 1 : step - 1;
    EXPECT_EQ(all->first_stored_step(), want_first) << "after step " << step;
  }
}

TEST(TraceStoreTest, AReplayedStepReplacesTheOlderRecord) {
  TraceStore store(3, 4);
  for (int64_t step = 0; step < 3; ++step) store.Add(Record("j", 0, step));
  store.Add(Record("j", 0, 1, /*epoch=*/2));  // replayed after a restart
  store.Add(Record("j", 0, 0, /*epoch=*/2));  // still in the window
  absl::StatusOr<v1::GetTraceResponse> all =
      store.Get("j", std::nullopt, std::nullopt);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->steps_size(), 3);
  EXPECT_EQ(all->steps(0).epoch(), 2);
  EXPECT_EQ(all->steps(1).epoch(), 2);
  EXPECT_EQ(all->steps(2).epoch(), 1);
  store.Add(Record("j", 0, 3));
  // Older than every kept step of a full window: dropped.
  store.Add(Record("j", 0, 0, 3));
  all = store.Get("j", std::nullopt, std::nullopt);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->first_stored_step(), 1);
  EXPECT_EQ(all->steps_size(), 3);
}

TEST(TraceStoreTest, ForgetsTheStalestJobBeyondTheLimit) {
  TraceStore store(2, /*keep_jobs=*/2);
  store.Add(Record("a", 0, 0));
  store.Add(Record("b", 0, 0));
  store.Add(Record("a", 0, 1));  // a is now fresher than b
  store.Add(Record("c", 0, 0));  // evicts b
  EXPECT_EQ(store.jobs(), 2u);
  EXPECT_TRUE(store.Get("a", std::nullopt, std::nullopt).ok());
  EXPECT_TRUE(store.Get("c", std::nullopt, std::nullopt).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      store.Get("b", std::nullopt, std::nullopt).status()));
}

TEST(TraceStoreTest, BadRangesGetClearStatuses) {
  TraceStore store(4, 4);
  for (int64_t step = 10; step < 14; ++step) store.Add(Record("j", 0, step));
  absl::Status backwards = store.Get("j", 5, 2).status();
  EXPECT_TRUE(absl::IsInvalidArgument(backwards)) << backwards;
  EXPECT_THAT(std::string(backwards.message()),
              HasSubstr("first_step 5 is after last_step 2"));
  EXPECT_TRUE(absl::IsInvalidArgument(store.Get("j", -1, 2).status()));
  absl::Status gone = store.Get("j", 0, 5).status();
  EXPECT_TRUE(absl::IsOutOfRange(gone)) << gone;
  EXPECT_THAT(std::string(gone.message()),
              HasSubstr("steps 0..5 of job j are not stored; the controller "
                        "keeps steps 10..13 (the last 4 of each stage)"));
  EXPECT_TRUE(absl::IsOutOfRange(store.Get("j", 20, std::nullopt).status()));
  absl::Status none = store.Get("other", std::nullopt, std::nullopt).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(none)) << none;
  EXPECT_THAT(std::string(none.message()), HasSubstr("job other"));
}

TEST(ControllerGetTraceTest, UnknownAndNotYetRunJobs) {
  ControllerOptions options;
  options.checkpoint_dir = ::testing::TempDir();
  Controller controller(options);
  v1::GetTraceRequest request;
  absl::Status empty = controller.GetTrace(request).status();
  EXPECT_TRUE(absl::IsInvalidArgument(empty)) << empty;
  request.set_job_id("job-nope");
  absl::Status unknown = controller.GetTrace(request).status();
  EXPECT_TRUE(absl::IsNotFound(unknown)) << unknown;
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("job-nope not found"));

  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(R"({
    "model": {"input": {"dtype": "FLOAT32", "shape": {"dims": [4]}},
              "layers": [{"linear": {"inFeatures": 4, "outFeatures": 2}}],
              "loss": {"softmaxCrossEntropy": {}}},
    "optimizer": {"lr": 0.1, "sgd": {}},
    "data": {"synthetic": {"task": "CLASSES", "features": 4, "classes": 2,
                           "trainSamples": 64}},
    "batchSize": 8, "steps": 2})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::Job> job = controller.SubmitJob(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  request.set_job_id(job->id());
  absl::Status pending = controller.GetTrace(request).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(pending)) << pending;
  EXPECT_THAT(std::string(pending.message()), HasSubstr("PENDING"));
  request.set_first_step(3);
  request.set_last_step(1);
  EXPECT_TRUE(absl::IsInvalidArgument(controller.GetTrace(request).status()));
}

}  // namespace
}  // namespace gpipe::controller
