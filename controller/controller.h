// The controller's state machine: jobs, attached workers, scheduling,
// leases, reports from the stages and the final merge of their parameters,
// all behind one mutex (simple and correct beats clever). The gRPC service
// (controller_service.h) is a thin adapter over it.
//
// A job goes PENDING -> RUNNING when enough workers are free, then ends
// SUCCEEDED (every stage finished and their parameters were merged), FAILED
// or CANCELLED. A lost worker or a stage failure that may pass puts a
// running job in RESTARTING (at most max_restarts times; then FAILED): its
// other stages are cancelled and it waits for workers again, to restore its
// last committed checkpoint under a new epoch. A permanent failure (a loss
// that is not finite, bad data) fails it at once. Stages report checkpoint
// files; when every stage of the epoch has reported a step, the controller
// commits it (recovery.h). A job that runs on fewer stages than it asked for
// (elastic) grows back at the next committed checkpoint once enough workers
// are free. Reports carry the job's epoch; one from another epoch, another
// job, a worker not assigned to that stage, or about a job that is not
// RUNNING is ignored and counted (fencing).
//
// With a store (ControllerOptions::store_path) every change of a job is
// written to SQLite; Recover() takes the jobs back after a restart and puts
// every unfinished one in RESTARTING.
#ifndef GPIPE_CONTROLLER_CONTROLLER_H_
#define GPIPE_CONTROLLER_CONTROLLER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/job_store.h"
#include "controller/job_table.h"
#include "controller/stage_file_transfers.h"
#include "controller/store_writer.h"
#include "controller/trace_store.h"
#include "controller/worker_registry.h"
#include "gpipe/v1/controller.pb.h"
#include "services/telemetry/controller_metrics.h"

namespace gpipe::controller {

// How long a LinkFailed report waits for its cause (JobRecord's
// HeldLinkFailure): the neighbour's own report follows its closed link
// within milliseconds, a killed process's closed Attach stream within a
// poll.
inline constexpr absl::Duration kLinkFailureHold = absl::Seconds(1);

struct ControllerOptions {
  // Final models go to <checkpoint_dir>/<job id>/model.safetensors; the
  // stages write theirs under <checkpoint_dir>/<job id>/final.
  std::string checkpoint_dir = "gpipe-checkpoints";
  // How the stages' files reach checkpoint_dir: uploaded through the
  // controller's API (workers share no disk with it), or written by the
  // stages themselves on a path every worker shares with the controller.
  gpipe::v1::CheckpointTransport checkpoint_transport =
      gpipe::v1::CHECKPOINT_TRANSPORT_CONTROLLER;
  // Limits on uploads and fetches of stage files (through the controller).
  TransferOptions transfers;
  // Whether the controller sees the paths workers read data and init_from
  // weights from (a volume it mounts too, or one machine): a job naming a
  // path that does not exist then fails at submit, and what only the data
  // says (a 0 vocab_size, standardization) is filled in here. Off where the
  // controller mounts no data.
  bool check_data_paths = true;
  // The controller's own secrets (its token files, TLS key, job store): a
  // job's data and init_from paths may not name them, since the submit-time
  // checks quote what they read (a job API user read the worker token from
  // "no column" errors and attached a worker with it).
  std::vector<std::string> private_files;
  // With check_data_paths, a submitted job's data files and init_from
  // weights are read value by value (a NaN feature, a label past the
  // head's classes, a weight of another shape) before it is scheduled,
  // when the check would hold no more than this many bytes
  // (ContentCheckBytes); larger ones are left to the stages. 0: never.
  int64_t content_check_bytes = int64_t{1} << 30;
  // A worker silent for longer is lost; workers are told to send a
  // heartbeat every heartbeat_interval.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Restarts, checkpoints and recovery durations are counted here when set
  // (not owned; must outlive the controller).
  ControllerMetrics* metrics = nullptr;
  // Stage timelines kept for GetTrace: the last `trace_steps` steps of each
  // stage, for the `trace_jobs` jobs that reported most recently.
  int64_t trace_steps = TraceStore::kDefaultKeepSteps;
  int64_t trace_jobs = TraceStore::kDefaultKeepJobs;
  // The SQLite job store; empty: jobs live in memory only.
  std::string store_path;
  // Ended jobs are deleted (DeleteJob) this long after they ended; zero or
  // less: kept until deleted by hand.
  absl::Duration job_retention = absl::Hours(24 * 7);
  // What "now" is for leases, settle times, grace periods and events
  // (null: absl::Now). Tests inject a clock they advance by hand and call
  // Tick().
  std::function<absl::Time()> clock;
};

// What an Attach handler does next (see Controller::NextMessage).
struct Outgoing {
  std::optional<gpipe::v1::ControllerMessage> message;  // write this
  std::optional<absl::Status> end;  // or end the stream with this status
  // Neither: nothing yet; check the call is alive and ask again.
};

class Controller {
 public:
  explicit Controller(ControllerOptions options);
  ~Controller();  // Shutdown(), then stops the background threads.

  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Opens options.store_path (when set) and takes back the jobs it holds:
  // ended ones as they were, the others RESTARTING (PENDING if they never
  // ran). Call once, before serving. Errors name the store.
  absl::Status Recover();

  // Jobs. SubmitJob validates the spec (InvalidArgument naming the field).
  // Get and Cancel of an unknown id are NotFound; cancelling an ended job is
  // FailedPrecondition.
  absl::StatusOr<gpipe::v1::Job> SubmitJob(gpipe::v1::JobSpec spec);
  absl::StatusOr<gpipe::v1::Job> GetJob(std::string_view id);
  // A page of job summaries (JobSummary), newest first, after the job
  // `page_token` names; InvalidArgument for a token that names none.
  absl::StatusOr<gpipe::v1::ListJobsResponse> ListJobs(
      const gpipe::v1::ListJobsRequest& request);
  // Removes an ended job (FailedPrecondition otherwise), from memory and
  // the store, and its checkpoint directory (model included) off the lock.
  absl::Status DeleteJob(std::string_view id);
  absl::StatusOr<gpipe::v1::Job> CancelJob(std::string_view id);
  // A CANCELLED or FAILED job waits for workers again and restores its
  // newest committed checkpoint, as a restart does; its restarts start
  // from 0. FailedPrecondition for any other state, InvalidArgument for
  // steps not past the newest checkpoint.
  absl::StatusOr<gpipe::v1::Job> ResumeJob(
      const gpipe::v1::ResumeJobRequest& request);

  // Calls `send` with the job as it is now, then once per change, and
  // returns OK after the event of a terminal state (or when `send` returns
  // false: the client is gone). Cancelled once `cancelled()` is true,
  // Unavailable on shutdown, NotFound for an unknown id. `cancelled` is
  // polled at least every 100 ms.
  absl::Status WatchJob(
      std::string_view id, const std::function<bool()>& cancelled,
      const std::function<bool(const gpipe::v1::JobEvent&)>& send);

  std::vector<gpipe::v1::WorkerInfo> ListWorkers();  // attach order

  // Jobs and workers by state (every state present, zeros included), for
  // the gpipe_jobs and gpipe_workers gauges.
  ClusterCounts Counts();
  // The kept stage timelines of a job's steps [first, last] (0-based; an
  // end left out: the oldest or newest kept). NotFound for an unknown job,
  // InvalidArgument for a bad range, FailedPrecondition when nothing is kept
  // yet, OutOfRange when none of the range is kept.
  absl::StatusOr<gpipe::v1::GetTraceResponse> GetTrace(
      const gpipe::v1::GetTraceRequest& request);

  // The Attach protocol, for the stream's handler. AttachWorker registers
  // the worker of `hello` (replacing an older stream of the same worker id,
  // which counts as lost) and queues its Welcome; `disconnect` must end the
  // stream from any thread (the controller calls it when the lease expires
  // or on shutdown). Then the handler writes what NextMessage gives it and
  // passes every message read to HandleMessage; when the stream ends on the
  // worker's side (or a write fails) it calls DetachWorker.
  // `certificate`: the client certificate the stream came with (PEM; empty
  // without mutual TLS): a re-attach under a live id must present the same.
  absl::StatusOr<std::shared_ptr<WorkerRecord>> AttachWorker(
      const gpipe::v1::WorkerHello& hello, std::string certificate,
      std::function<void()> disconnect);
  // Waits up to `max_wait` for a message for `worker` or the end of its
  // stream.
  Outgoing NextMessage(WorkerRecord& worker, absl::Duration max_wait);
  void HandleMessage(WorkerRecord& worker,
                     const gpipe::v1::WorkerMessage& message);
  // The worker is gone (`why` says how, for people); `end` is the status its
  // stream ends with. A running stage's job restarts (WorkerLost, counted
  // against its max_restarts), or with `drained` (the worker said goodbye:
  // SIGTERM, a rollout or a node drain, which people plan) restarts
  // without spending one (WorkerDrained): two rollouts failed a job of
  // max_restarts 1, and a rollout of 4 workers raised the restart alert.
  void DetachWorker(WorkerRecord& worker, absl::Status end,
                    std::string_view why, bool drained = false);

  // Stage files through the controller. Where the upload of `header` goes
  // (the path its report must then name), once it is known to come from a
  // stage of the job's running epoch (its stream key, else
  // PermissionDenied; another epoch or a job not running is
  // FailedPrecondition) and to be a checkpoint step of the job or its final
  // parameters (InvalidArgument otherwise).
  absl::StatusOr<std::string> StageFileDestination(
      const gpipe::v1::StageFileHeader& header) ABSL_LOCKS_EXCLUDED(mu_);
  // What FetchModel sends: the final model's path (step 0; FailedPrecondition
  // until the job has SUCCEEDED) or the manifest of the committed checkpoint
  // of `step` (NotFound naming the steps kept). NotFound for an unknown job.
  absl::StatusOr<std::string> ModelToFetch(
      const gpipe::v1::FetchModelRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // The manifest of the committed checkpoint a fetch asks for, checked the
  // same way; NotFound when the job keeps no checkpoint of that step.
  absl::StatusOr<std::string> CheckpointToFetch(
      const gpipe::v1::FetchCheckpointRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every Attach and WatchJob stream and refuses new ones. Idempotent.
  void Shutdown();

  // One pass of the lease thread at `now`: expires workers silent for
  // longer than the heartbeat timeout, and starts waiting jobs whose settle
  // time or elastic grace period has run out. The thread calls it at least
  // every heartbeat_timeout / 4 (at most 100 ms).
  void Tick(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the file work queued so far (checkpoint commits, restore
  // point checks, merges) is done, so a test can assert what it did.
  void FlushIo() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time Now() const {
    return options_.clock ? options_.clock() : absl::Now();
  }

  // Reports ignored by fencing (old epoch, other job, wrong stage).
  int64_t ignored_reports();
  // Committed checkpoints found corrupt or truncated (DataLoss) when a job
  // was to restore them; each time the one before was used instead.
  int64_t corrupt_checkpoints();

  const ControllerOptions& options() const { return options_; }

 private:
  // Every change ends with Changed(): Attach writers and watchers wait for
  // it.
  void Changed() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { changed_.SignalAll(); }
  void Reschedule(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Removes `worker`; fails its job when it was running a stage.
  void LoseWorker(const std::shared_ptr<WorkerRecord>& worker, absl::Status end,
                  std::string_view why, bool disconnect, absl::Time now,
                  bool drained = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the running cut's bubbles by the stages' measured times
  // (JobStatus.cut_bubbles) and hands each worker its own, when one moved
  // by kCutBubbleMoves or more since the last.
  void SendCutBubbles(JobRecord& job, const std::vector<double>& bubbles)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the stages of `job` (all but `except`, which is gone or failed)
  // and frees their workers.
  void ReleaseStages(JobRecord& job, const std::string& why,
                     const WorkerRecord* except)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A running job lost a stage to something that may pass: RESTARTING
  // (counted against max_restarts when `counted`), or FAILED once they are
  // used up. The caller reschedules.
  void RestartOrFail(JobRecord& job, std::string_view reason,
                     const std::string& message, const WorkerRecord* except,
                     bool counted, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restarts `job` for its held LinkFailed report (HeldLinkFailure) once the
  // hold is over and nothing else restarted or ended it. True when it did.
  bool RestartForHeldLinkFailure(JobRecord& job, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker lost within a heartbeat timeout of a neighbour's LinkFailed
  // report that restarted its job: the job's Running condition names the
  // lost worker as the cause, not the neighbour whose link it broke.
  void BlameLostWorker(const WorkerRecord& worker, const std::string& why,
                       absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stage's CheckpointStoreFull that arrives after its neighbour's
  // LinkFailed of the same epoch restarted the job: that restart is the
  // full store's, so it is not counted and the job makes room. True when
  // the report was taken so.
  bool BlameFullStore(const gpipe::v1::StageFailed& f, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The restart blamed on job.link_blame's broken link was `cause`'s: the
  // Running condition (while the job waits) names it with `reason`, and
  // with `uncounted` no longer says "restart N of M". The blame is used
  // up. Returns the condition's text.
  std::string Reattribute(JobRecord& job, std::string_view reason,
                          const std::string& cause, bool uncounted,
                          absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes, off the lock, the job's stage files that can no longer commit:
  // those of epochs before the running one, and once `ended` every
  // uncommitted one and its emptied folder (RemoveStaleStageFiles).
  void RemoveStaleFiles(const JobRecord& job, bool ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a full checkpoint store (job.make_room), at the restart's restore
  // check or, where none runs, the start: drops the job's oldest committed
  // checkpoint where another is left, and keeps one fewer from then on
  // (recovery.h, DropOldestCheckpoint), so a store with room for exactly
  // `keep` of them goes on. Nothing when the store was not full.
  void MakeRoomForCheckpoint(JobRecord& job, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RestartOrFail for a job of several replicas: its workers keep their
  // stages' states (StageParked), and once they have said what they kept
  // (FinishParking) the next start resumes from memory where it can
  // (replica_resume.h).
  void RestartReplicas(JobRecord& job, std::string_view reason,
                       const std::string& message, const WorkerRecord* except,
                       bool counted, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnParked(WorkerRecord& worker, const gpipe::v1::StageParked& p,
                absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The parked states are in (or their time is up): plans the resume.
  void FinishParking(JobRecord& job, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A running job of fewer replicas than its spec's grows back when free
  // workers allow more (at the step its workers hold). True when one did.
  // Reschedule and the lease thread's tick both try: workers that became
  // free while the epoch was starting (or a held-back one that beats
  // again) bring no event of their own.
  bool GrowReplicas(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `job` in a terminal `state`: cancels its other stages (all but
  // `except`), frees its workers, records the condition and the event.
  // The caller reschedules.
  void EndJob(JobRecord& job, gpipe::v1::JobState state, std::string_view type,
              std::string_view reason, const std::string& message,
              const WorkerRecord* except, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job a report of `worker` is about, or nullptr (counted, logged)
  // when fencing rejects it.
  JobRecord* ReportedJob(const WorkerRecord& worker, std::string_view what,
                         const std::string& job_id, int64_t epoch,
                         int64_t stage, int64_t replica = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The running job whose stage `stage` of `epoch` presented `stream_key`,
  // or why a transfer of its files is refused.
  absl::StatusOr<JobRecord*> TransferringJob(const std::string& job_id,
                                             int64_t epoch, int64_t stage,
                                             const std::string& stream_key)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void OnProgress(WorkerRecord& worker, const gpipe::v1::StepProgress& p,
                  absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnTrace(WorkerRecord& worker, const gpipe::v1::StepTrace& t,
               absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFinished(WorkerRecord& worker, const gpipe::v1::StageFinished& f,
                  absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnFailed(WorkerRecord& worker, const gpipe::v1::StageFailed& f,
                absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnEvaluated(WorkerRecord& worker, const gpipe::v1::StageEvaluated& e,
                   absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps an evaluation of the job's last stage (periodic or final) in its
  // status and the eval gauges.
  void KeepEvaluation(JobRecord& job, const gpipe::v1::Evaluation& e)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCheckpointed(WorkerRecord& worker,
                      const gpipe::v1::StageCheckpointed& c, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Restarts `job` when a stage reported nothing for longer than its stall
  // timeout, quarantining the silent stages' workers; whether it did.
  bool CheckStalled(JobRecord& job, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes an ended job and queues the removal of its files, wherever its
  // checkpoints and model lie (under an earlier --checkpoint_dir too),
  // logging `why`; the store's ticket, and the removal's queued I/O in
  // `io` (for WaitIo) when it is set.
  uint64_t RemoveJob(const std::string& id, std::string_view why,
                     uint64_t* io = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An ended job restored from the store exports its loss (NaN for a loss
  // that was not finite) and newest evaluation again, as before the
  // restart: a routine restart cleared GpipeLossNotFinite until the job
  // was deleted. Its counters start again at 0.
  void ExportEndedJob(const JobRecord& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until the queued I/O task `seq` (EnqueueIo's) has run, the
  // controller stops, or `most` has passed.
  void WaitIo(uint64_t seq, absl::Duration most) ABSL_LOCKS_EXCLUDED(mu_);

  void LeaseLoop();  // calls Tick
  // Tick with mu_ held; true when anything changed.
  bool TickLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // File work is done off the lock, in order (restore checks first), by
  // io_thread_ (LevelDB's
  // pattern): decide under the lock, read and write without it, apply the
  // result under it again. Heartbeats, Attach and the API never wait for a
  // disk.
  // kUrgent goes to the front of the queue (a restart waits for it);
  // kFinishOnStop still runs when the controller stops; kLong (a submitted
  // job's content check, seconds of reading) runs on a thread of its own,
  // check_thread_, so that commits and restore checks never wait behind it.
  enum class IoTask { kNormal, kUrgent, kFinishOnStop, kLong };
  struct QueuedIo {
    std::function<void()> run;
    IoTask kind = IoTask::kNormal;
    uint64_t seq = 0;  // in the order queued
  };
  // Returns the task's number in the queue (WaitIo).
  uint64_t EnqueueIo(std::function<void()> task, IoTask kind = IoTask::kNormal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IoLoop(std::deque<QueuedIo>* tasks);
  // At the committed checkpoint of `step`: re-partitions the job when the
  // balancer says it pays (rebalance.h), as a restart from that checkpoint.
  void Rebalance(JobRecord& job, int64_t step, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Verifies the stages' files of a checkpoint, writes its manifest (with
  // the job's `spec`), then records it (grows an elastic job back, or
  // re-partitions it).
  void CommitCheckpointIo(const std::string& job_id, int64_t epoch,
                          std::vector<gpipe::v1::StageCheckpointed> reports,
                          const gpipe::v1::JobSpec& spec)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Finds the newest intact checkpoint of `committed` for the job's next
  // start, drops the corrupt ones, and schedules again.
  void CheckRestorePointIo(
      const std::string& job_id,
      const std::vector<gpipe::v1::CheckpointRef>& committed)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The bytes a content check of `spec` would hold (ContentCheckBytes)
  // where this controller checks contents and they are within its limit;
  // none otherwise.
  std::optional<int64_t> ContentCheckToRun(
      const gpipe::v1::JobSpec& spec) const;
  // Holds a job that never ran back from scheduling while
  // CheckContentsIo reads its data and starting weights (`bytes` of them,
  // as ContentCheckBytes counts).
  void CheckContentsFirst(JobRecord& job, int64_t bytes, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads a submitted job's data and starting weights (CheckJobContents):
  // the job is scheduled once they read well, and fails naming what does
  // not. What the controller cannot judge (a file it may not read, memory
  // it lacks) is left to the stages.
  void CheckContentsIo(const std::string& job_id,
                       const gpipe::v1::JobSpec& spec) ABSL_LOCKS_EXCLUDED(mu_);
  // Commits the final parameters and merges them into one model file.
  void MergeIo(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);

  const ControllerOptions options_;
  // Both outlive jobs_, which queues every change for the writer. Set by
  // Recover() before serving, then read without the lock (SubmitJob and
  // CancelJob wait for their writes outside it).
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<StoreWriter> store_writer_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  JobTable jobs_ ABSL_GUARDED_BY(mu_);
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  std::deque<QueuedIo> io_tasks_ ABSL_GUARDED_BY(mu_);
  std::deque<QueuedIo> long_io_tasks_ ABSL_GUARDED_BY(mu_);  // kLong
  uint64_t io_queued_ ABSL_GUARDED_BY(mu_) = 0;         // the last seq given
  std::set<uint64_t> io_pending_ ABSL_GUARDED_BY(mu_);  // queued or running
  TraceStore traces_ ABSL_GUARDED_BY(mu_);
  // Workers already warned about for a clock that runs ahead.
  std::set<std::string> clock_ahead_warned_ ABSL_GUARDED_BY(mu_);
  int64_t ignored_reports_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t corrupt_checkpoints_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread lease_thread_;
  std::thread io_thread_;
  std::thread check_thread_;  // runs long_io_tasks_
};

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_CONTROLLER_H_
