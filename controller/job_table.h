// The jobs the controller knows, by id, with what the state machine needs
// beyond the Job message: per-stage progress, finished stages, checkpoint
// reports, and the recent events that WatchJob streams. In memory, and
// written through to the job store (when there is one) on every change; not
// thread-safe (the controller's one mutex guards it).
#ifndef GPIPE_CONTROLLER_JOB_TABLE_H_
#define GPIPE_CONTROLLER_JOB_TABLE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "controller/balancer.h"
#include "controller/job_store.h"
#include "controller/replica_resume.h"
#include "controller/store_writer.h"
#include "gpipe/v1/controller.pb.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/schedule.h"

namespace gpipe::controller {

struct JobRecord {
  gpipe::v1::Job job;  // what GetJob returns
  uint64_t seq = 0;    // submission order: FIFO scheduling, ListJobs
  int64_t stages = 1;  // K

  // For the current epoch: R (pipeline.replicas; 1 for one pipeline), and
  // per worker, indexed by Slot(stage, replica).
  int64_t replicas = 1;
  int64_t start_step = 0;                  // where the epoch began
  std::vector<int64_t> stage_steps;        // steps completed
  std::vector<absl::Time> stage_reported;  // last report (or the start)
  std::vector<bool> finished;              // StageFinished came
  // Per stage: replica 0's final parameters ("" until it finished).
  std::vector<std::string> finished_paths;
  // Why the final evaluation failed, as the finished stages said it (the
  // stage whose own part failed preferred); "" when it did not.
  std::string evaluation_error;
  bool evaluation_error_here = false;
  // With replicas: each step's micro-batch losses from the replicas' last
  // stages until all M came (then the step's loss is their sum in order),
  // and the batch's normalizer.
  std::map<int64_t, std::map<int64_t, gpipe::v1::MicroBatchLoss>>
      micro_batch_losses;
  // Each step's loss and step time from the last stage, kept until every
  // stage has completed the step: the last stage finishes a step's
  // backward first, and its loss shown beside the step before read as
  // that step's.
  struct StepFigures {
    double loss = 0;
    double step_seconds = 0;
  };
  std::map<int64_t, StepFigures> step_figures;
  // Elastic replicas (replica_resume.h): after the epoch `parking_epoch`
  // (0: none) ended, what its workers kept in memory (StageParked, by
  // worker id), until all of `parking_expected` reported or
  // `parking_until`; then the plan the next start resumes from instead of
  // a checkpoint.
  int64_t parking_epoch = 0;
  absl::Time parking_until = absl::InfinitePast();
  std::set<std::string> parking_expected;
  absl::Time parking_backoff = absl::InfinitePast();  // RestartOrFail's
  std::map<std::string, gpipe::v1::StageParked> parked;
  std::vector<std::pair<int64_t, int64_t>> parking_cut;  // layer ranges
  std::optional<MemoryResume> memory_resume;
  bool merging = false;  // every stage finished; the merge is under way
  // The current epoch's stream key (in memory only, never stored or shown):
  // what a stage presents to upload or fetch the job's files.
  std::string stream_key;
  // Checkpoint reports of the current epoch not yet committed: step ->
  // one report per stage (empty path until that stage reported).
  std::map<int64_t, std::vector<gpipe::v1::StageCheckpointed>> checkpointing;
  // When the job began waiting for workers (PENDING or RESTARTING): the
  // elastic grace period counts from here.
  absl::Time waiting_since = absl::InfinitePast();
  // A restarting job is not scheduled before this: the failure that
  // restarted it often comes from a neighbour of a dead worker whose own
  // stream has not broken yet, and that worker must not be chosen again.
  absl::Time not_before = absl::InfinitePast();
  // Restarts since the job last made progress (a step past the one it
  // restarted from): the restart backoff doubles with each.
  int64_t restarts_without_progress = 0;
  // When the running job last lost a stage: gpipe_recovery_duration_seconds
  // measures from here to RUNNING again (a planned restart, a re-partition
  // or a resize, is no recovery).
  absl::Time recovery_began = absl::InfinitePast();
  // A stage found the checkpoint store full: the next start drops the
  // oldest checkpoint once it knows which one it restores.
  bool make_room = false;
  // A restart blamed on a stage's broken link (LinkFailed), for a few
  // seconds: a neighbour that died broke it, and that neighbour's own
  // detach often arrives after the report. When one of `workers` is lost
  // meanwhile, the restart is said to be its.
  struct LinkBlame {
    absl::Time at;
    int64_t epoch = 0;              // the epoch whose link broke
    std::set<std::string> workers;  // the epoch's workers but the reporter
    std::string message;            // the cause as the restart gave it
  };
  std::optional<LinkBlame> link_blame;
  // A stage's broken link (LinkFailed) is a symptom: its cause (the
  // neighbour's full checkpoint store, its permanent failure, its lost
  // worker) usually reports a few milliseconds later. The report is held
  // for kLinkFailureHold; whatever of the same epoch comes meanwhile
  // restarts or ends the job as its own, and the hold lapses. Otherwise the
  // lease thread's tick restarts the job for the link (counted).
  struct HeldLinkFailure {
    absl::Time until;
    int64_t epoch = 0;
    std::string worker_id;          // the reporter
    std::set<std::string> workers;  // the epoch's workers but the reporter
    std::string message;
  };
  std::optional<HeldLinkFailure> held_link_failure;
  // The checkpoint the next start restores, checked off the controller's
  // lock (recovery.h, CheckRestorePoint) before the job may start: kNeeded
  // until a check is asked for, kChecking while it runs. Each start uses
  // it up: a restart checks again.
  enum class RestoreCheck { kNeeded, kChecking, kChecked };
  RestoreCheck restore_check = RestoreCheck::kNeeded;
  std::optional<gpipe::v1::CheckpointRef> restore_point;  // when kChecked

  // The self-balancing pipeline (balancer.h; in memory: a controller
  // restart measures again). What every stage measured, across epochs.
  LayerCostBook layer_costs;
  std::shared_ptr<const ModelShapes> model_shapes;  // of the spec, once
  // This epoch: per stage, the progress reports that carried layer times;
  // a running estimate of the step time (the last stage's reports after
  // the first few) and how many reports made it.
  std::vector<int64_t> timed_reports;
  // This epoch: per stage, a running estimate of what replica 0's stage
  // costs by its own reports (its layers' times summed, the recompute in
  // its backward, its update), for the cut's bubble (PredictRunningCut).
  // Each stage's own: the layer book's estimates share a class's times
  // across workers through their speeds, which swung the simulated
  // bubble of a 2-stage cut from 3% to 52% between estimates.
  std::vector<std::optional<StageCost>> stage_costs;
  double step_seconds = 0;
  int64_t step_reports = 0;
  // Cuts the job has run (CutKey), never proposed again.
  std::set<std::string> tried_cuts;
  // The newest re-partition waits for its measured step time; it measured
  // slower than the cut before, which the next checkpoint restores.
  bool measuring_repartition = false;
  bool revert_pending = false;
  // The cut the last checkpoint's estimates proposed (empty: none): the
  // job moves there only once the next checkpoint's estimates predict that
  // it gains enough too.
  std::vector<int64_t> proposed_balance;
  std::vector<std::string> proposed_workers;
  std::string proposed_reason;  // RebalanceProposal::reason

  // Every change is one event; `version` numbers the latest. The latest
  // kEventHistory events are kept (fewer once the job has ended), so a
  // watcher that is briefly behind still sees each transition.
  uint64_t version = 0;
  uint64_t store_ticket = 0;  // of the newest Publish (StoreWriter)
  std::deque<gpipe::v1::JobEvent> events;  // events.back() is `version`
  gpipe::v1::JobState logged_state = gpipe::v1::JOB_STATE_UNSPECIFIED;

  const std::string& id() const { return job.id(); }
  // Stages of the current epoch (elastic: at most `stages`).
  int64_t running_stages() const { return job.status().running_stages(); }
  // The worker index of `stage` (WorkerInfo.stage of its worker): the
  // stage, or with v chunks per worker the one of its W workers the
  // schedule places it on (WorkerOfStage).
  int64_t WorkerIndexOf(int64_t stage) const {
    const int64_t v = VirtualStageCount(job.spec());
    const int64_t w = running_stages() / v;
    return v > 1 && w > 0
               ? WorkerOfStage(
                     ScheduleFromSpec(job.spec().pipeline().schedule()), w,
                     stage)
               : stage;
  }
  // The index of (stage, replica) into the per-worker vectors; -1 when the
  // current epoch has no such worker.
  int64_t Slot(int64_t stage, int64_t replica) const {
    const int64_t k = running_stages();
    if (stage < 0 || stage >= k || replica < 0 || replica >= replicas) {
      return -1;
    }
    return replica * k + stage;
  }
  // Every worker's entry of the current epoch: replica 0's stages, then the
  // other replicas'.
  std::vector<const gpipe::v1::StageStatus*> AllStages() const {
    std::vector<const gpipe::v1::StageStatus*> all;
    for (const auto& s : status().stages()) all.push_back(&s);
    for (const auto& s : status().replica_stages()) all.push_back(&s);
    return all;
  }
  gpipe::v1::JobStatus& status() { return *job.mutable_status(); }
  const gpipe::v1::JobStatus& status() const { return job.status(); }
};

class JobTable {
 public:
  static constexpr size_t kEventHistory = 256;
  static constexpr size_t kEndedEventHistory = 16;

  JobTable();

  // Stores `spec` as a new PENDING job with a fresh id ("job-<8 hex>").
  // The caller publishes its first event.
  JobRecord& Add(gpipe::v1::JobSpec spec, int64_t stages, absl::Time now);
  // Takes back a job from the store as it was; the caller decides how it
  // resumes. AlreadyExists for a duplicate id.
  absl::StatusOr<JobRecord*> Restore(StoredJob stored, int64_t stages);

  // Every Publish queues the job for `store` from now on (may be null).
  void set_store(StoreWriter* store) { store_ = store; }

  JobRecord* Find(std::string_view id);
  // Forgets job `id` (its events too) and queues its removal from the
  // store; the store's ticket (0 without one).
  uint64_t Remove(std::string_view id);

  // Jobs waiting for workers: RESTARTING ones (they were running), then
  // PENDING ones, each oldest first (by submission: a resumed job keeps
  // its place).
  std::vector<JobRecord*> Waiting();
  // Jobs whose stages run (RUNNING, not merging), oldest first.
  std::vector<JobRecord*> Running();
  // Every job, newest first.
  std::vector<const JobRecord*> NewestFirst() const;

  // Records a change of `job` as an event with `message` (for people),
  // logs a line when its state changed, and queues it for the store.
  // Returns the store's ticket (StoreWriter::WaitWritten; 0 without one).
  uint64_t Publish(JobRecord& job, std::string message, absl::Time now);

 private:
  std::string NewId();

  std::map<std::string, std::unique_ptr<JobRecord>, std::less<>> jobs_;
  uint64_t next_seq_ = 0;
  std::mt19937_64 rng_;
  StoreWriter* store_ = nullptr;
};

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_JOB_TABLE_H_
