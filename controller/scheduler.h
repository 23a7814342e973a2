// The scheduler: starts waiting jobs (PENDING, or RESTARTING after a lost
// worker), oldest first, on free workers. A job of K stages takes the K free
// workers that attached first; its layers are partitioned over them
// (PartitionJob), its epoch is bumped, and each worker gets an Assignment
// naming its neighbours and the committed checkpoint to restore (the newest
// whose files still match their manifest: checked off the controller's lock
// before the job starts, see check_restore_point). A job that has waited longer
// than its elastic grace period runs on fewer workers, down to min_stages.
// Strict FIFO: a job that does not fit yet holds back the jobs behind it, so
// a large job is never starved by a stream of small ones.
#ifndef GPIPE_CONTROLLER_SCHEDULER_H_
#define GPIPE_CONTROLLER_SCHEDULER_H_

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "controller/job_table.h"
#include "controller/worker_registry.h"

namespace gpipe::controller {

// One scheduling pass; call it whenever a job is submitted or a worker
// becomes free. Jobs left waiting get their Scheduled condition's message
// updated ("needs K workers, N free"). Final parameters of a job go to
// <checkpoint_dir>/<job id>/final; `transport` says how the stages' files
// get there (the assignment's checkpoint_transport).
// A job with committed checkpoints that could start has its restore point
// checked first: ScheduleJobs marks it kChecking and calls
// `check_restore_point` (which must do the I/O off the lock, set
// restore_point and kChecked, and schedule again); meanwhile it holds its
// place in the queue.
void ScheduleJobs(JobTable& jobs, WorkerRegistry& workers,
                  const std::string& checkpoint_dir,
                  gpipe::v1::CheckpointTransport transport, absl::Time now,
                  const std::function<void(JobRecord&)>& check_restore_point);

// The elastic grace period of `spec` (pipeline.elastic_grace_ms, default
// 10 s) and its minimum stage count (pipeline.min_stages, default K).
absl::Duration ElasticGrace(const gpipe::v1::JobSpec& spec);
int64_t MinStages(const gpipe::v1::JobSpec& spec);
// The fewest workers `spec` can start on: MinStages times its replicas
// (pipeline.min_replicas where set). A waiting job that needs more than
// are attached holds no job behind it back.
int64_t LeastWorkers(const gpipe::v1::JobSpec& spec);

// How a job's running stages read in its messages: "1 stage", "4 stages",
// and for an interleaved schedule's k stages as v chunks on each of k / v
// workers "2 stages x 2 chunks", as the spec counts its stages.
std::string StagesText(int64_t k, int64_t v);

// "needs 2 workers, 1 free"; with replicas "needs 4 workers, 1 free (2
// stages x 2 replicas)".
std::string WaitingMessage(int64_t stages, int64_t replicas, int64_t free);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_SCHEDULER_H_
