#include "controller/controller.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "controller/balancer.h"
#include "controller/job_status.h"
#include "controller/merge.h"
#include "controller/placement.h"
#include "controller/private_paths.h"
#include "controller/rebalance.h"
#include "controller/recovery.h"
#include "controller/replica_resume.h"
#include "controller/scheduler.h"
#include "services/core/bytes.h"
#include "services/core/log.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/pipeline/content_check.h"
#include "services/pipeline/data_resolution.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/model_file.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/step_plan.h"
#include "services/security/stream_key.h"
#include "services/storage/checkpoint_layout.h"
#include "services/storage/file_io.h"
#include "services/storage/manifest.h"
#include "services/storage/sha256.h"

namespace gpipe::controller {

namespace v1 = gpipe::v1;

namespace {

constexpr absl::Duration kPollInterval = absl::Milliseconds(100);
// How long a restarting job waits before it is scheduled again, so that the
// streams of workers that died with the failure are noticed first.
constexpr absl::Duration kRestartSettle = absl::Milliseconds(250);
// How long a job of several replicas waits for its workers to say what
// they kept in memory (a worker that is gone says nothing; one that is
// alive says it within a step).
constexpr absl::Duration kParkingWait = absl::Seconds(3);
constexpr absl::Duration kMaxRestartBackoff = absl::Seconds(30);
constexpr std::string_view kCheckpointStoreFull = "CheckpointStoreFull";

// A change of the cut's bubble that is news to the workers' gauges: the
// measured layer times move a little every estimate.
constexpr double kCutBubbleMoves = 0.01;
constexpr int64_t kDefaultPageSize = 100;
constexpr int64_t kMaxPageSize = 1000;
// The stall watchdog (pipeline.stall_timeout_ms) and its quarantine, which
// doubles for a worker each time it stalls a job.
constexpr absl::Duration kFirstStepStall = absl::Minutes(5);
constexpr absl::Duration kMinStall = absl::Seconds(60);
constexpr absl::Duration kQuarantine = absl::Seconds(30);
constexpr absl::Duration kMaxQuarantine = absl::Minutes(10);

// base, 2 base, 4 base ... for the n-th time in a row (n >= 1), at most
// `cap`: the restart backoff and the quarantine.
absl::Duration DoublingBackoff(absl::Duration base, int64_t n,
                               absl::Duration cap) {
  return std::min(cap,
                  base * (int64_t{1} << std::clamp<int64_t>(n - 1, 0, 10)));
}

absl::Status JobNotFound(std::string_view id) {
  // An id is echoed only as long as ids are: a 100 KB one sent back in the
  // status message outgrew gRPC's metadata limit, and the client saw a
  // transport error instead of "not found".
  constexpr size_t kMaxShown = 64;
  if (id.size() > kMaxShown) {
    return absl::NotFoundError(
        absl::StrCat("job ", AsAbsl(id.substr(0, kMaxShown)), "... (",
                     id.size(), " bytes, longer than any job id) not found"));
  }
  return absl::NotFoundError(absl::StrCat("job ", AsAbsl(id), " not found"));
}

std::string ShortDuration(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

}  // namespace

Controller::Controller(ControllerOptions options)
    : options_(std::move(options)),
      traces_(options_.trace_steps, options_.trace_jobs) {
  lease_thread_ = std::thread([this] { LeaseLoop(); });
  io_thread_ = std::thread([this] { IoLoop(&io_tasks_); });
  check_thread_ = std::thread([this] { IoLoop(&long_io_tasks_); });
}

Controller::~Controller() {
  Shutdown();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    Changed();
  }
  lease_thread_.join();
  io_thread_.join();
  check_thread_.join();
}

void Controller::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  shutting_down_ = true;
  for (const std::shared_ptr<WorkerRecord>& worker : workers_.All()) {
    workers_.Remove(worker->id());
    worker->lost = true;
    worker->gone = absl::UnavailableError("the controller is shutting down");
    if (worker->disconnect) worker->disconnect();
  }
  Changed();
}

int64_t Controller::ignored_reports() {
  absl::MutexLock lock(&mu_);
  return ignored_reports_;
}

int64_t Controller::corrupt_checkpoints() {
  absl::MutexLock lock(&mu_);
  return corrupt_checkpoints_;
}

namespace {

// Job folders under the checkpoint folder that no job owns are logged once
// at the start, with what to do: nothing else would ever delete them.
void WarnOfUnknownJobDirs(const std::string& checkpoint_dir,
                          const std::set<std::string>& known, bool stored) {
  const std::vector<std::string> unknown =
      UnknownJobDirs(checkpoint_dir, known);
  if (unknown.empty()) return;
  std::vector<std::string> shown(
      unknown.begin(), unknown.begin() + std::min<size_t>(3, unknown.size()));
  LogWarning(
      "%d job folder%s in %s belong%s to no job this controller knows (%s%s): "
      "the files of jobs %s; copy what you need (a job's model.safetensors, "
      "its checkpoints) and remove the rest",
      unknown.size(), unknown.size() == 1 ? "" : "s", checkpoint_dir,
      unknown.size() == 1 ? "s" : "", absl::StrJoin(shown, ", "),
      unknown.size() > shown.size() ? ", ..." : "",
      stored ? "its job store does not hold (another store's, or deleted "
               "while it was down)"
             : "an earlier controller ran (without --store, a restart "
               "forgets its jobs: run with --store to keep them)");
}

}  // namespace

absl::Status Controller::Recover() {
  if (options_.store_path.empty()) {
    WarnOfUnknownJobDirs(options_.checkpoint_dir, {}, /*stored=*/false);
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store =
      JobStore::Open(options_.store_path);
  if (!store.ok()) return store.status();
  absl::StatusOr<LoadedJobs> loaded = (*store)->LoadAll();
  if (!loaded.ok()) return loaded.status();
  for (const std::string& bad : loaded->bad) {
    LogError("job store %s: skipped a bad row: %s", options_.store_path, bad);
  }
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  store_ = std::move(*store);
  store_writer_ =
      std::make_unique<StoreWriter>(store_.get(), [metrics = options_.metrics] {
        if (metrics != nullptr) metrics->OnStoreFailure();
      });
  jobs_.set_store(store_writer_.get());
  int64_t resumed = 0;
  for (StoredJob& stored : loaded->jobs) {
    const int64_t k = StageCount(stored.job.spec());
    absl::StatusOr<JobRecord*> restored = jobs_.Restore(std::move(stored), k);
    if (!restored.ok()) {
      LogError("job store %s: %s", options_.store_path,
               restored.status().ToString());
      continue;
    }
    JobRecord& job = **restored;
    v1::JobStatus& status = job.status();
    // Jobs stored by a controller that listed the final parameters as a
    // checkpoint: they are none (MergeIo).
    if (RemoveFinalParametersRefs(options_.checkpoint_dir, job.id(), &status)) {
      jobs_.Publish(job, "the final parameters are not a checkpoint", now);
    }
    if (IsTerminal(status.state())) {
      jobs_.Publish(job, "restored from the job store", now);
      ExportEndedJob(job);
      continue;
    }
    ++resumed;
    if (options_.metrics != nullptr) options_.metrics->OnJob(job.id());
    // A job that was running restarts; one that was queued (a resumed one
    // too, with an epoch behind it) stays queued, behind those that ran.
    const bool ran = status.epoch() > 0 && status.state() != v1::PENDING;
    status.set_state(ran ? v1::RESTARTING : v1::PENDING);
    if (ran) job.recovery_began = now;
    status.clear_stages();
    status.clear_replica_stages();
    status.clear_cut_bubbles();
    status.set_running_stages(0);
    job.waiting_since = now;
    RecoverRebalanceState(job);
    // A content check the stopped controller did not finish runs again.
    if (const v1::Condition* scheduled = FindCondition(status, kScheduled);
        !ran && scheduled != nullptr && scheduled->reason() == "CheckingData") {
      if (const std::optional<int64_t> bytes =
              ContentCheckToRun(job.job.spec())) {
        CheckContentsFirst(job, *bytes, now);
      } else {
        SetCondition(&status, kScheduled, false, "WaitingForWorkers",
                     "waiting for workers", now);
      }
    }
    std::string message = "the controller restarted";
    if (ran) {
      absl::StrAppend(
          &message, "; resuming from ",
          status.checkpoints().empty()
              ? std::string("the beginning")
              : absl::StrCat(
                    "the checkpoint of step ",
                    status.checkpoints(status.checkpoints_size() - 1).step()));
      SetCondition(&status, kRunning, false, "ControllerRestarted", message,
                   now);
    }
    jobs_.Publish(job, message, now);
  }
  LogInfo("job store %s: %d jobs, %d to resume", options_.store_path,
          loaded->jobs.size(), resumed);
  std::set<std::string> known;
  for (const JobRecord* job : jobs_.NewestFirst()) known.insert(job->id());
  WarnOfUnknownJobDirs(options_.checkpoint_dir, known, /*stored=*/true);
  Reschedule(now);
  Changed();
  return absl::OkStatus();
}

// ---- Jobs -----------------------------------------------------------------

absl::StatusOr<v1::Job> Controller::SubmitJob(v1::JobSpec spec) {
  RETURN_IF_ERROR(CheckNoPrivatePaths(spec, options_.private_files));
  if (options_.check_data_paths) {
    if (absl::Status seen = CheckSpecPathsExist(spec); !seen.ok()) {
      return absl::Status(
          seen.code(),
          absl::StrCat(seen.message(),
                       " on the controller (workers read the same path: mount "
                       "the data where both see it, or run the controller "
                       "with --check_data_paths=false when only workers "
                       "mount it)"));
    }
    // The data is read here only when the spec leaves something to it
    // (gpipectl fills those in where it can read the data), after the
    // preprocessing a model file it starts from records.
    RETURN_IF_ERROR(AdoptInitFromPreprocessing(&spec));
    RETURN_IF_ERROR(ResolveAndValidateJobSpec(&spec));
  } else {
    RETURN_IF_ERROR(ValidateJobSpec(spec));
  }
  // The data and starting weights, value by value, off the lock once the
  // job is stored; it waits unscheduled meanwhile. Larger files than the
  // controller may hold are left to the stages.
  const std::optional<int64_t> content_bytes = ContentCheckToRun(spec);
  const int64_t k = StageCount(spec);
  // A spec the partitioner refuses fails when scheduled (PartitionFailed),
  // as it always did; one it cuts is checked against the workers' memory.
  // An interleaved schedule cuts K x v chunks, v on each of the K workers.
  const int64_t v = VirtualStageCount(spec);
  absl::StatusOr<StagePlan> plan = PlanStages(spec, k * v);
  if (plan.ok() && v > 1) {
    plan = WorkerPlan(*plan, ScheduleFromSpec(spec.pipeline().schedule()), k);
  }
  const absl::Time now = Now();
  v1::Job submitted;
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      return absl::UnavailableError("the controller is shutting down");
    }
    if (plan.ok()) {
      RETURN_IF_ERROR(CheckFitsCluster(*plan, WorkerMemory(workers_.All())));
    }
    JobRecord& job = jobs_.Add(std::move(spec), k, now);
    if (options_.metrics != nullptr) options_.metrics->OnJob(job.id());
    const std::string waiting =
        WaitingMessage(k, ReplicaCount(job.job.spec()),
                       static_cast<int64_t>(workers_.Free(now).size()));
    SetCondition(&job.status(), kScheduled, false, "WaitingForWorkers", waiting,
                 now);
    if (content_bytes.has_value()) {
      CheckContentsFirst(job, *content_bytes, now);
    }
    ticket = jobs_.Publish(job, absl::StrCat("submitted: ", waiting), now);
    Reschedule(now);
    Changed();
    submitted = job.job;
  }
  // Acknowledged only once stored, off the lock. A job the store could not
  // record (a full disk) is refused and ended: acknowledged, a restart of
  // the controller would have lost it without a word.
  if (store_writer_ != nullptr) {
    absl::Status stored = store_writer_->WaitStored(ticket, submitted.id());
    if (!stored.ok()) {
      {
        absl::MutexLock lock(&mu_);
        if (JobRecord* job = jobs_.Find(submitted.id()); job != nullptr) {
          if (!IsTerminal(job->status().state())) {
            EndJob(*job, v1::FAILED, kFailed, "NotStored",
                   "the job store could not record the job", nullptr, Now());
          }
          RemoveJob(job->id(), "as the store could not record it");
          Reschedule(Now());
          Changed();
        }
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          "the controller's job store could not record the job, so it was "
          "not started: ",
          stored.message()));
    }
  }
  return submitted;
}

std::optional<int64_t> Controller::ContentCheckToRun(
    const v1::JobSpec& spec) const {
  if (!options_.check_data_paths || options_.content_check_bytes <= 0) {
    return std::nullopt;
  }
  absl::StatusOr<std::optional<int64_t>> bytes = ContentCheckBytes(spec);
  if (!bytes.ok() || !bytes->has_value() ||
      **bytes > options_.content_check_bytes) {
    return std::nullopt;
  }
  return *bytes;
}

void Controller::CheckContentsFirst(JobRecord& job, int64_t bytes,
                                    absl::Time now) {
  job.not_before = absl::InfiniteFuture();  // CheckContentsIo ends it
  SetCondition(&job.status(), kScheduled, false, "CheckingData",
               absl::StrCat("reading its data and starting weights (",
                            FormatBytes(bytes), ") before it is scheduled"),
               now);
  EnqueueIo([this, id = job.id(),
             spec = job.job.spec()] { CheckContentsIo(id, spec); },
            IoTask::kLong);
}

void Controller::CheckContentsIo(const std::string& job_id,
                                 const v1::JobSpec& spec) {
  absl::Status contents;
  try {
    contents = CheckJobContents(spec);
  } catch (const std::bad_alloc&) {
    // The controller's own limit, not the job's: the stages judge it.
    contents = absl::ResourceExhaustedError(
        "the controller ran out of memory reading them");
  }
  absl::MutexLock lock(&mu_);
  JobRecord* job = jobs_.Find(job_id);
  if (job == nullptr || job->status().state() != v1::PENDING ||
      job->not_before != absl::InfiniteFuture()) {
    return;
  }
  const absl::Time now = Now();
  // What the data says is the job's fault; a file the controller may not
  // read (another user than the workers'), or memory it lacks, is not.
  const absl::StatusCode code = contents.code();
  if (!contents.ok() && code != absl::StatusCode::kInvalidArgument &&
      code != absl::StatusCode::kDataLoss &&
      code != absl::StatusCode::kNotFound &&
      code != absl::StatusCode::kFailedPrecondition) {
    LogWarning(
        "job %s: its data was not checked here (%s); its stages check it as "
        "they open it",
        job_id, contents.ToString());
    contents = absl::OkStatus();
  }
  if (!contents.ok()) {
    EndJob(*job, v1::FAILED, kFailed, "InvalidData",
           absl::StrCat("its data or starting weights cannot be used: ",
                        contents.message()),
           nullptr, now);
  } else {
    job->not_before = absl::InfinitePast();
    const std::string waiting =
        WaitingMessage(job->stages, ReplicaCount(job->job.spec()),
                       static_cast<int64_t>(workers_.Free(now).size()));
    SetCondition(&job->status(), kScheduled, false, "WaitingForWorkers",
                 waiting, now);
    jobs_.Publish(
        *job,
        absl::StrCat("its data and starting weights were read; ", waiting),
        now);
  }
  Reschedule(now);
  Changed();
}

absl::StatusOr<v1::Job> Controller::GetJob(std::string_view id) {
  absl::MutexLock lock(&mu_);
  const JobRecord* job = jobs_.Find(id);
  if (job == nullptr) return JobNotFound(id);
  return job->job;
}

absl::StatusOr<v1::ListJobsResponse> Controller::ListJobs(
    const v1::ListJobsRequest& request) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError("page_size: must not be negative");
  }
  const int64_t size =
      request.page_size() == 0
          ? kDefaultPageSize
          : std::min<int64_t>(request.page_size(), kMaxPageSize);
  uint64_t after = std::numeric_limits<uint64_t>::max();
  if (!request.page_token().empty() &&
      !absl::SimpleAtoi(request.page_token(), &after)) {
    // Echoed only as long as a token is (JobNotFound says why).
    const std::string& token = request.page_token();
    return absl::InvalidArgumentError(absl::StrCat(
        "page_token \"", token.substr(0, 32), token.size() > 32 ? "..." : "",
        "\" is not a token ListJobs gave"));
  }
  v1::ListJobsResponse response;
  absl::MutexLock lock(&mu_);
  uint64_t last_seq = 0;  // of the last job on the page
  for (const JobRecord* job : jobs_.NewestFirst()) {
    if (job->seq >= after) continue;
    if (response.jobs_size() == size) {
      response.set_next_page_token(absl::StrCat(last_seq));
      break;
    }
    *response.add_jobs() = JobSummary(job->job);
    last_seq = job->seq;
  }
  return response;
}

absl::Status Controller::DeleteJob(std::string_view id) {
  uint64_t ticket = 0, io = 0;
  {
    absl::MutexLock lock(&mu_);
    JobRecord* job = jobs_.Find(id);
    if (job == nullptr) return JobNotFound(id);
    if (!IsTerminal(job->status().state())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job->id(), " is ", v1::JobState_Name(job->status().state()),
          "; cancel it before deleting it"));
    }
    ticket = RemoveJob(job->id(), "by the user", &io);
    Changed();
  }
  if (store_writer_ != nullptr && ticket != 0)
    store_writer_->WaitWritten(ticket);
  // Answered once its files are gone (a script that looked right after
  // found them all still there), or after a few seconds behind other
  // jobs' file work: the caller's deadline is not to run out on a delete
  // that was made.
  WaitIo(io, absl::Seconds(5));
  return absl::OkStatus();
}

void Controller::ExportEndedJob(const JobRecord& job) {
  if (options_.metrics == nullptr) return;
  const v1::JobStatus& status = job.status();
  options_.metrics->OnJob(job.id());
  const v1::Condition* failed = FindCondition(status, kFailed);
  if (failed != nullptr && failed->status() &&
      failed->reason() == "LossNotFinite") {
    options_.metrics->ObserveLoss(job.id(),
                                  std::numeric_limits<double>::quiet_NaN());
  } else if (status.step() > 0) {
    options_.metrics->ObserveLoss(job.id(), status.loss());
  }
  if (status.has_latest_evaluation()) {
    options_.metrics->ObserveEvaluation(job.id(),
                                        status.latest_evaluation().loss(),
                                        status.latest_evaluation().accuracy());
  }
}

uint64_t Controller::RemoveJob(const std::string& id, std::string_view why,
                               uint64_t* io) {
  const JobRecord* job = jobs_.Find(id);
  const std::vector<std::string> dirs =
      JobFileDirs(options_.checkpoint_dir, id,
                  job != nullptr ? job->status() : v1::JobStatus());
  LogInfo("job %s deleted %s, with %s", id, why, absl::StrJoin(dirs, " and "));
  const uint64_t seq =
      EnqueueIo([dirs = std::vector<std::string>(dirs.begin(), dirs.end())] {
        RemoveCheckpointDirs(dirs);
      });
  if (io != nullptr) *io = seq;
  if (options_.metrics != nullptr) options_.metrics->ForgetJob(id);
  return jobs_.Remove(id);
}

absl::StatusOr<v1::Job> Controller::CancelJob(std::string_view id) {
  const absl::Time now = Now();
  absl::ReleasableMutexLock lock(&mu_);
  JobRecord* job = jobs_.Find(id);
  if (job == nullptr) return JobNotFound(id);
  const v1::JobState state = job->status().state();
  if (IsTerminal(state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", AsAbsl(id), " has already ended (",
                     v1::JobState_Name(state), ")"));
  }
  EndJob(*job, v1::CANCELLED, kCancelled, "UserRequested",
         "cancelled by the user", nullptr, now);
  Reschedule(now);
  Changed();
  const v1::Job cancelled = job->job;
  const uint64_t ticket = job->store_ticket;
  lock.Release();
  // Acknowledged only once stored.
  if (store_writer_ != nullptr) store_writer_->WaitWritten(ticket);
  return cancelled;
}

absl::StatusOr<v1::Job> Controller::ResumeJob(
    const v1::ResumeJobRequest& request) {
  const absl::Time now = Now();
  absl::ReleasableMutexLock lock(&mu_);
  JobRecord* job = jobs_.Find(request.job_id());
  if (job == nullptr) return JobNotFound(request.job_id());
  v1::JobStatus& status = job->status();
  if (status.state() != v1::CANCELLED && status.state() != v1::FAILED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job->id(), " is ", v1::JobState_Name(status.state()),
        ": only a cancelled or failed job resumes"));
  }
  const int64_t from =
      status.checkpoints().empty()
          ? InitialStep(job->job.spec())
          : status.checkpoints(status.checkpoints_size() - 1).step();
  if (request.steps() != 0) {
    if (request.steps() <= from) {
      return absl::InvalidArgumentError(absl::StrCat(
          "steps: ", request.steps(), " is not past the newest checkpoint (",
          from, " steps)"));
    }
    v1::JobSpec spec = job->job.spec();
    spec.set_steps(request.steps());
    RETURN_IF_ERROR(ValidateJobSpec(spec));
    *job->job.mutable_spec() = std::move(spec);
    status.set_total_steps(request.steps());
  }
  // As a restart: the scheduler checks the newest checkpoint and every
  // stage restores it; exact as any recovery is.
  status.set_state(v1::PENDING);
  status.clear_finished();
  status.clear_stages();
  status.clear_replica_stages();
  status.clear_cut_bubbles();
  status.set_restarts(0);
  status.set_step(from);
  // This run's time starts when it is scheduled again (ScheduleJobs): the
  // time it sat cancelled was counted, 42.7 s for 20 steps where the run
  // took 5.
  status.clear_started();
  status.set_run_from_step(from);
  RemoveCondition(&status, kFailed);
  RemoveCondition(&status, kCancelled);
  job->waiting_since = now;
  job->not_before = now;
  job->restarts_without_progress = 0;
  job->restore_check = JobRecord::RestoreCheck::kNeeded;
  job->restore_point.reset();
  job->recovery_began = absl::InfinitePast();
  // Its counters from 0 again where a restored controller had none.
  if (options_.metrics != nullptr) options_.metrics->OnJob(job->id());
  const std::string message =
      absl::StrCat("resumed by the user from ",
                   from == 0 ? std::string("the beginning")
                             : absl::StrCat("the checkpoint of step ", from),
                   ", ", job->job.spec().steps(), " steps in all");
  SetCondition(&status, kRunning, false, "Resumed", message, now);
  jobs_.Publish(*job, message, now);
  Reschedule(now);
  Changed();
  const v1::Job resumed = job->job;
  const uint64_t ticket = job->store_ticket;
  lock.Release();
  if (store_writer_ != nullptr) store_writer_->WaitWritten(ticket);
  return resumed;
}

absl::Status Controller::WatchJob(
    std::string_view id, const std::function<bool()>& cancelled,
    const std::function<bool(const v1::JobEvent&)>& send) {
  v1::JobEvent event;
  uint64_t seen = 0;
  {
    absl::MutexLock lock(&mu_);
    const JobRecord* job = jobs_.Find(id);
    if (job == nullptr) return JobNotFound(id);
    *event.mutable_time() = ToTimestamp(Now());
    *event.mutable_job() = job->job;
    event.set_message(job->events.empty() ? "" : job->events.back().message());
    seen = job->version;
  }
  while (true) {
    if (!send(event) || IsTerminal(event.job().status().state())) {
      return absl::OkStatus();
    }
    absl::MutexLock lock(&mu_);
    const JobRecord* job = jobs_.Find(id);
    while (job != nullptr && job->version == seen && !shutting_down_ &&
           !cancelled()) {
      changed_.WaitWithTimeout(&mu_, kPollInterval);
      job = jobs_.Find(id);
    }
    if (job == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("job ", AsAbsl(id), " was deleted"));
    }
    if (shutting_down_) {
      return absl::UnavailableError("the controller is shutting down");
    }
    if (cancelled()) return absl::CancelledError("the watch was cancelled");
    // The next event, or the latest when this watcher fell behind the kept
    // history.
    const uint64_t first = job->version - job->events.size() + 1;
    const uint64_t next = std::max(seen + 1, first);
    event = job->events[next - first];
    seen = next;
  }
}

// ---- Traces ---------------------------------------------------------------

absl::StatusOr<v1::GetTraceResponse> Controller::GetTrace(
    const v1::GetTraceRequest& request) {
  if (request.job_id().empty()) {
    return absl::InvalidArgumentError("job_id is empty");
  }
  absl::MutexLock lock(&mu_);
  const JobRecord* job = jobs_.Find(request.job_id());
  if (job == nullptr) return JobNotFound(request.job_id());
  absl::StatusOr<v1::GetTraceResponse> trace = traces_.Get(
      request.job_id(),
      request.has_first_step() ? std::optional<int64_t>(request.first_step())
                               : std::nullopt,
      request.has_last_step() ? std::optional<int64_t>(request.last_step())
                              : std::nullopt);
  if (!trace.ok() && absl::IsFailedPrecondition(trace.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat(trace.status().message(), "; the job is ",
                     v1::JobState_Name(job->status().state())));
  }
  if (!trace.ok()) return trace.status();
  // An interleaved schedule's chunks are stages of their own.
  trace->set_stages(job->stages * VirtualStageCount(job->job.spec()));
  trace->set_micro_batches(MicroBatchCount(job->job.spec()));
  // An elastic job may have run more replicas than it runs now.
  int64_t replicas = job->replicas;
  for (const v1::StepTrace& t : trace->steps())
    replicas = std::max(replicas, t.replica() + 1);
  trace->set_replicas(replicas);
  const v1::Schedule schedule = job->job.spec().pipeline().schedule();
  trace->set_schedule(schedule == v1::SCHEDULE_UNSPECIFIED ? v1::GPIPE
                                                           : schedule);
  return trace;
}

// ---- Stage files through the controller -------------------------------------

absl::StatusOr<JobRecord*> Controller::TransferringJob(
    const std::string& job_id, int64_t epoch, int64_t stage,
    const std::string& stream_key) {
  JobRecord* job = jobs_.Find(job_id);
  if (job == nullptr) return JobNotFound(job_id);
  const v1::JobStatus& status = job->status();
  if (status.state() != v1::RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", v1::JobState_Name(status.state()),
                     ", not RUNNING"));
  }
  if (epoch != status.epoch()) {
    return absl::FailedPreconditionError(
        absl::StrCat("epoch ", epoch, " of job ", job_id,
                     " is over (the job runs epoch ", status.epoch(), ")"));
  }
  // An empty key would accept anything: a running epoch always has one.
  if (job->stream_key.empty() || stream_key.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("no stream key for the files of job ", job_id));
  }
  RETURN_IF_ERROR(security::CheckStreamKey(job->stream_key, stream_key));
  if (stage < 0 || stage >= status.running_stages()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", stage, " is not a stage of job ", job_id,
                     " (it runs ", status.running_stages(), ")"));
  }
  return job;
}

absl::StatusOr<std::string> Controller::StageFileDestination(
    const v1::StageFileHeader& header) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord * job,
                   TransferringJob(header.job_id(), header.epoch(),
                                   header.stage(), header.stream_key()));
  if (header.final()) {
    return FinalFilePath(options_.checkpoint_dir, job->id(), header.epoch(),
                         header.stage());
  }
  const StepPlan plan = StepPlan::FromSpec(job->job.spec());
  if (!plan.CheckpointsAfter(header.step())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", header.step(), " is not a checkpoint step of job ", job->id(),
        " (every ", plan.checkpoint_every(), ", ", plan.steps(), " steps)"));
  }
  return CheckpointFilePath(options_.checkpoint_dir, job->id(), header.step(),
                            header.epoch(), header.stage());
}

absl::StatusOr<std::string> Controller::CheckpointToFetch(
    const v1::FetchCheckpointRequest& request) {
  // No stage holds no layers: a range that is empty or inverted would be
  // answered with the manifest alone, which reads as a checkpoint without
  // this stage's files.
  if (request.layer_begin() < 0 ||
      request.layer_end() <= request.layer_begin()) {
    return absl::InvalidArgumentError(
        absl::StrCat("layers [", request.layer_begin(), ", ",
                     request.layer_end(), ") are no stage's"));
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(JobRecord * job,
                   TransferringJob(request.job_id(), request.epoch(),
                                   request.stage(), request.stream_key()));
  for (const v1::CheckpointRef& ref : job->status().checkpoints()) {
    if (ref.step() == request.step()) return ref.manifest_path();
  }
  return absl::NotFoundError(absl::StrCat(
      "job ", job->id(), " keeps no checkpoint of step ", request.step()));
}

absl::StatusOr<std::string> Controller::ModelToFetch(
    const v1::FetchModelRequest& request) {
  if (request.step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("step: ", request.step(), " is negative"));
  }
  absl::MutexLock lock(&mu_);
  const JobRecord* job = jobs_.Find(request.job_id());
  if (job == nullptr) return JobNotFound(request.job_id());
  const v1::JobStatus& status = job->status();
  std::string kept;
  for (const v1::CheckpointRef& ref : status.checkpoints()) {
    if (request.step() != 0 && ref.step() == request.step()) {
      return ref.manifest_path();
    }
    absl::StrAppend(&kept, kept.empty() ? "" : ", ", ref.step());
  }
  kept = kept.empty() ? "it keeps no checkpoints"
                      : absl::StrCat("it keeps the checkpoints of steps ", kept,
                                     " (fetch one with --step)");
  if (request.step() != 0) {
    return absl::NotFoundError(absl::StrCat("job ", job->id(),
                                            " has no checkpoint of step ",
                                            request.step(), "; ", kept));
  }
  if (status.model_path().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job->id(), " is ", v1::JobState_Name(status.state()),
        ": its model is written when it succeeds; ", kept));
  }
  return status.model_path();
}

// ---- Workers --------------------------------------------------------------

std::vector<v1::WorkerInfo> Controller::ListWorkers() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> workers;
  const absl::Time now = Now();
  for (const auto& worker : workers_.All()) {
    v1::WorkerInfo& info = workers.emplace_back(worker->info);
    if (info.state() != v1::IDLE) continue;
    if (now < worker->quarantined_until) {
      info.set_held_back(absl::StrCat(
          "quarantined for ", ShortDuration(worker->quarantined_until - now),
          ": it stalled a job (", worker->quarantines, " time",
          worker->quarantines > 1 ? "s" : "", ")"));
    } else if (worker->last_heartbeat <= worker->suspect_since) {
      info.set_held_back(absl::StrCat(
          "silent for ", ShortDuration(now - worker->last_heartbeat),
          " since a neighbour's link to it broke: no stage until it beats"));
    }
  }
  return workers;
}

ClusterCounts Controller::Counts() {
  ClusterCounts counts;
  for (v1::JobState state : {v1::PENDING, v1::RUNNING, v1::RESTARTING,
                             v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    counts.jobs[v1::JobState_Name(state)] = 0;
  }
  counts.workers[v1::WorkerState_Name(v1::IDLE)] = 0;
  counts.workers[v1::WorkerState_Name(v1::BUSY)] = 0;
  absl::MutexLock lock(&mu_);
  for (const JobRecord* job : jobs_.NewestFirst())
    ++counts.jobs[v1::JobState_Name(job->status().state())];
  for (const auto& worker : workers_.All())
    ++counts.workers[v1::WorkerState_Name(worker->info.state())];
  return counts;
}

absl::StatusOr<std::shared_ptr<WorkerRecord>> Controller::AttachWorker(
    const v1::WorkerHello& hello, std::string certificate,
    std::function<void()> disconnect) {
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  if (shutting_down_) {
    return absl::UnavailableError("the controller is shutting down");
  }
  // Worker ids are unique per process start: a second Attach under the same
  // id with the same session key is that process again (its old stream may
  // not have broken on this side yet), so the newer stream replaces the
  // older. Anyone else saying that id is refused: a forged hello must not
  // cost the real worker its stage, nor its job a restart.
  if (std::shared_ptr<WorkerRecord> old = workers_.Find(hello.worker_id())) {
    if (!old->session_key.empty() &&
        !security::CheckStreamKey(old->session_key, hello.session_key()).ok()) {
      LogWarning(
          "refused a hello under the id of live worker %s: another "
          "session key",
          hello.worker_id());
      return absl::AlreadyExistsError(absl::StrCat(
          "worker ", hello.worker_id(),
          " is attached on another stream with another session key"));
    }
    // With mutual TLS the id also belongs to the certificate it attached
    // with: a key that leaked does not let another certificate's holder
    // take the worker's place.
    if (old->certificate != certificate) {
      LogWarning(
          "refused a hello under the id of live worker %s: another client "
          "certificate",
          hello.worker_id());
      return absl::AlreadyExistsError(
          absl::StrCat("worker ", hello.worker_id(),
                       " is attached with another client certificate"));
    }
    LoseWorker(old,
               absl::AbortedError("replaced by a newer Attach stream of the "
                                  "same worker"),
               "it attached again", /*disconnect=*/true, now);
  }
  absl::StatusOr<std::shared_ptr<WorkerRecord>> worker =
      workers_.Add(hello, now);
  if (!worker.ok()) return worker.status();
  (*worker)->disconnect = std::move(disconnect);
  (*worker)->certificate = std::move(certificate);
  v1::ControllerMessage welcome;
  welcome.mutable_welcome()->set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(options_.heartbeat_interval));
  welcome.mutable_welcome()->set_address(hello.address());
  WorkerRegistry::Send(**worker, std::move(welcome));
  LogInfo("worker %s attached from %s (%d cpus, %d gpus%s)", hello.worker_id(),
          hello.address(), hello.resources().cpus(), hello.resources().gpus(),
          hello.resources().probe_gflops() > 0
              ? absl::StrFormat(", probe %.1f GFLOP/s",
                                hello.resources().probe_gflops())
              : std::string());
  Reschedule(now);
  Changed();
  return worker;
}

Outgoing Controller::NextMessage(WorkerRecord& worker,
                                 absl::Duration max_wait) {
  const absl::Time deadline = absl::Now() + max_wait;
  absl::MutexLock lock(&mu_);
  while (worker.outbox.empty() && !worker.lost) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return {};
    changed_.WaitWithTimeout(&mu_, left);
  }
  Outgoing out;
  if (!worker.outbox.empty()) {
    out.message = std::move(worker.outbox.front());
    worker.outbox.pop_front();
  } else {
    out.end = worker.gone;
  }
  return out;
}

void Controller::HandleMessage(WorkerRecord& worker,
                               const v1::WorkerMessage& message) {
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  if (worker.lost) return;
  worker.last_heartbeat = now;
  *worker.info.mutable_last_heartbeat() = ToTimestamp(now);
  switch (message.kind_case()) {
    case v1::WorkerMessage::kHeartbeat:
      return;  // the lease is renewed above
    case v1::WorkerMessage::kProgress:
      OnProgress(worker, message.progress(), now);
      break;
    case v1::WorkerMessage::kTrace:
      OnTrace(worker, message.trace(), now);
      return;  // nothing a watcher sees changed
    case v1::WorkerMessage::kFinished:
      OnFinished(worker, message.finished(), now);
      break;
    case v1::WorkerMessage::kFailed:
      OnFailed(worker, message.failed(), now);
      break;
    case v1::WorkerMessage::kGoodbye:  // ends the stream in the service
      return;
    case v1::WorkerMessage::kCheckpointed:
      OnCheckpointed(worker, message.checkpointed(), now);
      break;
    case v1::WorkerMessage::kEvaluated:
      OnEvaluated(worker, message.evaluated(), now);
      break;
    case v1::WorkerMessage::kParked:
      OnParked(worker, message.parked(), now);
      break;
    case v1::WorkerMessage::kHello:
      LogWarning("worker %s sent a second hello; ignored", worker.id());
      return;
    case v1::WorkerMessage::KIND_NOT_SET:
      LogWarning("worker %s sent an empty message; ignored", worker.id());
      return;
  }
  Changed();
}

void Controller::DetachWorker(WorkerRecord& worker, absl::Status end,
                              std::string_view why, bool drained) {
  const absl::Time now = Now();
  absl::MutexLock lock(&mu_);
  if (worker.lost) return;
  std::shared_ptr<WorkerRecord> registered = workers_.Find(worker.id());
  if (registered.get() != &worker) return;
  LoseWorker(registered, std::move(end), why, /*disconnect=*/false, now,
             drained);
  Changed();
}

// ---- The state machine ----------------------------------------------------

void Controller::Reschedule(absl::Time now) {
  if (shutting_down_) return;
  for (JobRecord* job : jobs_.Waiting()) {
    if (job->parking_epoch > 0 && now >= job->parking_until)
      FinishParking(*job, now);
  }
  GrowReplicas(now);
  std::vector<JobRecord*> recovering;
  std::vector<std::pair<JobRecord*, int64_t>> epochs;
  for (JobRecord* job : jobs_.Waiting()) {
    if (job->status().state() == v1::RESTARTING) recovering.push_back(job);
    epochs.emplace_back(job, job->status().epoch());
  }
  ScheduleJobs(jobs_, workers_, options_.checkpoint_dir,
               options_.checkpoint_transport, now,
               [this](JobRecord& job) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                 std::vector<v1::CheckpointRef> committed(
                     job.status().checkpoints().begin(),
                     job.status().checkpoints().end());
                 // A restart waits for it: ahead of merges and commits.
                 EnqueueIo(
                     [this, id = job.id(), committed = std::move(committed)] {
                       CheckRestorePointIo(id, committed);
                     },
                     IoTask::kUrgent);
               });
  // A started job's files of its earlier epochs can never commit: a
  // failed checkpoint's (or a killed write's) go now, ahead of this
  // epoch's first checkpoint.
  for (const auto& [job, before] : epochs) {
    // The scheduler fails a job it cannot cut or key (PartitionFailed,
    // StreamKeyFailed) itself, past EndJob's count.
    if (job->status().state() == v1::FAILED && options_.metrics != nullptr) {
      options_.metrics->OnJobFailed();
    }
    if (job->status().epoch() == before) continue;
    // A start that checked no checkpoint (a resume from the replicas'
    // memory) makes the room here.
    MakeRoomForCheckpoint(*job, now);
    if (before > 0) RemoveStaleFiles(*job, /*ended=*/false);
  }
  if (options_.metrics == nullptr) return;
  for (JobRecord* job : recovering) {
    if (job->status().state() != v1::RUNNING ||
        job->recovery_began == absl::InfinitePast()) {
      continue;
    }
    options_.metrics->ObserveRecovery(
        absl::ToDoubleSeconds(now - job->recovery_began));
    job->recovery_began = absl::InfinitePast();
  }
}

void Controller::LoseWorker(const std::shared_ptr<WorkerRecord>& worker,
                            absl::Status end, std::string_view why,
                            bool disconnect, absl::Time now, bool drained) {
  workers_.Remove(worker->id());
  worker->lost = true;
  worker->gone = std::move(end);
  if (disconnect && worker->disconnect) worker->disconnect();
  const v1::WorkerInfo& info = worker->info;
  LogInfo("worker %s at %s detached: %s", info.worker_id(), info.address(),
          why);
  BlameLostWorker(*worker, std::string(why), now);
  // A job waiting for what its workers kept will hear nothing from this one.
  for (JobRecord* waiting : jobs_.Waiting()) {
    if (waiting->parking_epoch > 0 &&
        waiting->parking_expected.erase(info.worker_id()) > 0 &&
        waiting->parking_expected.empty()) {
      FinishParking(*waiting, now);
    }
  }
  if (info.state() != v1::BUSY) {
    Reschedule(now);  // a PENDING job's "N free" changed
    return;
  }
  JobRecord* job = jobs_.Find(info.job_id());
  // Its stage, or with an interleaved schedule each of its chunks.
  bool unfinished = false;
  if (job != nullptr) {
    const int64_t v = VirtualStageCount(job->job.spec());
    const int64_t k = job->running_stages();
    for (int64_t c = 0; c < v; ++c) {
      const int64_t slot = job->Slot(
          StageOfChunk(ScheduleFromSpec(job->job.spec().pipeline().schedule()),
                       k / v, info.stage(), c),
          info.replica());
      unfinished =
          unfinished ||
          (slot >= 0 && slot < static_cast<int64_t>(job->finished.size()) &&
           !job->finished[slot]);
    }
  }
  if (job == nullptr || IsTerminal(job->status().state()) || job->merging ||
      !unfinished) {
    Reschedule(now);
    return;  // its stage was done: nothing is lost
  }
  if (job->status().state() != v1::RUNNING) {
    Reschedule(now);
    return;  // restarting already: the job holds no stages
  }
  const std::string message = absl::StrCat(
      "worker ", info.worker_id(), " at ", info.address(), " was lost at step ",
      job->status().step(), ": ", AsAbsl(why));
  const char* reason = drained ? "WorkerDrained" : "WorkerLost";
  if (ReplicaCount(job->job.spec()) > 1) {
    RestartReplicas(*job, reason, message, worker.get(),
                    /*counted=*/!drained, now);
  } else {
    RestartOrFail(*job, reason, message, worker.get(), /*counted=*/!drained,
                  now);
  }
  Reschedule(now);
}

void Controller::SendCutBubbles(JobRecord& job,
                                const std::vector<double>& bubbles) {
  v1::JobStatus& status = job.status();
  const bool changed = !std::equal(
      bubbles.begin(), bubbles.end(), status.cut_bubbles().begin(),
      status.cut_bubbles().end(),
      [](double a, double b) { return std::abs(a - b) < kCutBubbleMoves; });
  if (!changed) return;
  status.mutable_cut_bubbles()->Assign(bubbles.begin(), bubbles.end());
  // A worker's chunks share its bubble: the message goes to the worker of
  // each chunk 0, stage w of the K workers (all schedules place it there).
  const int64_t workers = static_cast<int64_t>(bubbles.size());
  for (const v1::StageStatus* stage : job.AllStages()) {
    const int64_t w = stage->stage();
    if (w >= workers) continue;
    std::shared_ptr<WorkerRecord> worker = workers_.Find(stage->worker_id());
    if (worker == nullptr || worker->info.job_id() != job.id()) continue;
    v1::ControllerMessage m;
    m.mutable_cut_bubble()->set_job_id(job.id());
    m.mutable_cut_bubble()->set_epoch(status.epoch());
    m.mutable_cut_bubble()->set_predicted_bubble(bubbles[w]);
    WorkerRegistry::Send(*worker, std::move(m));
  }
}

void Controller::ReleaseStages(JobRecord& job, const std::string& why,
                               const WorkerRecord* except) {
  for (const v1::StageStatus* stage : job.AllStages()) {
    std::shared_ptr<WorkerRecord> worker = workers_.Find(stage->worker_id());
    if (worker == nullptr || worker->info.state() != v1::BUSY ||
        worker->info.job_id() != job.id()) {
      continue;
    }
    if (worker.get() != except) {
      v1::ControllerMessage cancel;
      cancel.mutable_cancel()->set_job_id(job.id());
      cancel.mutable_cancel()->set_epoch(job.status().epoch());
      cancel.mutable_cancel()->set_reason(why);
      WorkerRegistry::Send(*worker, std::move(cancel));
    }
    WorkerRegistry::MarkIdle(*worker);
  }
}

void Controller::RestartOrFail(JobRecord& job, std::string_view reason,
                               const std::string& message,
                               const WorkerRecord* except, bool counted,
                               absl::Time now) {
  job.held_link_failure.reset();  // this restart, or the end, is the cause
  v1::JobStatus& status = job.status();
  const int64_t max = MaxRestarts(job.job.spec());
  if (counted && status.restarts() >= max) {
    EndJob(job, v1::FAILED, kFailed, reason,
           absl::StrCat(message, "; ",
                        max == 0 ? std::string("the job allows no restarts "
                                               "(max_restarts is 0)")
                                 : absl::StrCat("no restarts left (",
                                                "max_restarts ", max, ")")),
           except, now);
    return;
  }
  ReleaseStages(job, message, except);
  if (counted) {
    status.set_restarts(status.restarts() + 1);
    if (options_.metrics != nullptr) options_.metrics->OnRestart(job.id());
  }
  const bool planned = reason == "Rebalance" || reason == "Resize";
  if (!planned && job.recovery_began == absl::InfinitePast()) {
    job.recovery_began = now;
  }
  status.set_state(v1::RESTARTING);
  status.clear_stages();
  status.clear_replica_stages();
  status.clear_cut_bubbles();
  job.merging = false;
  job.checkpointing.clear();
  job.waiting_since = now;
  // Backoff: a restart that made no progress since the last one waits
  // twice as long as that one did, up to kMaxRestartBackoff, so a cause
  // that persists (a full disk, a crashing input) does not burn the
  // restarts in seconds.
  ++job.restarts_without_progress;
  job.not_before =
      now + DoublingBackoff(kRestartSettle, job.restarts_without_progress,
                            kMaxRestartBackoff);
  const std::string checkpoint =
      status.checkpoints().empty()
          ? std::string("the beginning")
          : absl::StrCat(
                "the checkpoint of step ",
                status.checkpoints(status.checkpoints_size() - 1).step());
  // Replicas resume from what their workers kept, where every stage kept it.
  const std::string from =
      ReplicaCount(job.job.spec()) > 1
          ? absl::StrCat("the replicas' memory (else ", checkpoint, ")")
          : checkpoint;
  const std::string restarting =
      counted ? absl::StrCat("restart ", status.restarts(), " of ", max, ": ",
                             message, "; resuming from ", from)
              : absl::StrCat(message, "; resuming from ", from);
  SetCondition(&status, kRunning, false, reason, restarting, now);
  jobs_.Publish(job, restarting, now);
}

void Controller::RemoveStaleFiles(const JobRecord& job, bool ended) {
  // Files of the epoch now running (or, ended, of the last) are all that
  // may still commit.
  EnqueueIo([dir = options_.checkpoint_dir, id = job.id(),
             epoch = job.status().epoch() + (ended ? 1 : 0), ended] {
    if (const int64_t n = RemoveStaleStageFiles(dir, id, epoch, ended); n > 0) {
      LogInfo("job %s: removed %d stale checkpoint files of epochs before %d",
              id, n, epoch);
    }
  });
}

void Controller::MakeRoomForCheckpoint(JobRecord& job, absl::Time now) {
  if (!std::exchange(job.make_room, false)) return;
  const int64_t before = job.status().checkpoints_size();
  std::optional<DroppedCheckpoint> dropped =
      DropOldestCheckpoint(&job.status());
  if (!dropped) return;  // the one left is the restore point
  job.status().set_checkpoint_keep(before - 1);
  const std::string message = absl::StrCat(
      "the checkpoint store is full: dropped the checkpoint of step ",
      dropped->step, " and keeping ", before - 1, " (the spec keeps ",
      job.job.spec().checkpoint().keep() > 0
          ? job.job.spec().checkpoint().keep()
          : 3,
      ")");
  LogWarning("job %s: %s", job.id(), message);
  jobs_.Publish(job, message, now);
  EnqueueIo([dir = std::move(dropped->dir)] { RemoveCheckpointDirs({dir}); });
}

void Controller::RestartReplicas(JobRecord& job, std::string_view reason,
                                 const std::string& message,
                                 const WorkerRecord* except, bool counted,
                                 absl::Time now) {
  const int64_t epoch = job.status().epoch();
  // Before the release below frees them: who may report what it kept.
  std::set<std::string> expected;
  for (const v1::StageStatus* s : job.AllStages()) {
    const int64_t slot = job.Slot(s->stage(), s->replica());
    if (slot >= 0 && slot < static_cast<int64_t>(job.finished.size()) &&
        job.finished[slot]) {
      continue;  // done: it keeps nothing
    }
    std::shared_ptr<WorkerRecord> w = workers_.Find(s->worker_id());
    if (w != nullptr && w->info.job_id() == job.id()) expected.insert(w->id());
  }
  std::vector<std::pair<int64_t, int64_t>> cut;
  for (const v1::StageStatus& s : job.status().stages())
    cut.emplace_back(s.layer_begin(), s.layer_end());
  RestartOrFail(job, reason, message, except, counted, now);
  if (job.status().state() != v1::RESTARTING) return;
  job.parking_epoch = epoch;
  job.parking_until = now + kParkingWait;
  job.parking_expected = std::move(expected);
  job.parking_cut = std::move(cut);
  job.memory_resume.reset();
  // A resize is no failure: it waits for nothing.
  job.parking_backoff = counted ? job.not_before : absl::InfinitePast();
  job.not_before = job.parking_until;  // the start waits for the plan
  // Parks that came while a LinkFailed was held (OnParked) count now.
  std::map<std::string, v1::StageParked> early = std::move(job.parked);
  job.parked.clear();
  for (auto& [id, p] : early) {
    if (p.epoch() == epoch && job.parking_expected.erase(id) > 0) {
      job.parked[id] = std::move(p);
    }
  }
  if (!job.parked.empty() && job.parking_expected.empty()) {
    FinishParking(job, now);
  }
}

void Controller::OnParked(WorkerRecord& worker, const v1::StageParked& p,
                          absl::Time now) {
  JobRecord* job = jobs_.Find(p.job_id());
  // A stage parks right after its failure report: while a LinkFailed is
  // held the job has not restarted yet, and the restart (RestartReplicas)
  // takes the parks kept here.
  if (job != nullptr && job->held_link_failure &&
      ReplicaCount(job->job.spec()) > 1 &&
      job->held_link_failure->epoch == p.epoch() &&
      job->status().epoch() == p.epoch() &&
      job->status().state() == v1::RUNNING) {
    job->parked[worker.id()] = p;
    return;
  }
  if (job == nullptr || IsTerminal(job->status().state()) ||
      job->parking_epoch == 0 || p.epoch() != job->parking_epoch ||
      job->parking_expected.erase(worker.id()) == 0) {
    LogInfo(
        "worker %s kept stage %d of %s (epoch %d) after step %d; no "
        "resume waits for it",
        worker.id(), p.stage(), p.job_id(), p.epoch(), p.step());
    return;
  }
  job->parked[worker.id()] = p;
  if (job->parking_expected.empty()) {
    FinishParking(*job, now);
    Reschedule(now);
  }
}

void Controller::FinishParking(JobRecord& job, absl::Time now) {
  job.parking_epoch = 0;
  job.parking_expected.clear();
  std::set<std::string> free;
  for (const auto& w : workers_.Free(now)) free.insert(w->id());
  std::optional<MemoryResume> plan = PlanMemoryResume(
      job.parking_cut, job.parked,
      [&free](const std::string& id) { return free.count(id) > 0; });
  const size_t kept = job.parked.size();
  job.parked.clear();
  // Everyone that could answer has. A first restart goes on at once (no
  // replay to wait for); one that made no progress since the last keeps
  // the growing backoff, so a cause that persists does not spin.
  job.not_before = job.restarts_without_progress > 1
                       ? std::max(now, job.parking_backoff)
                       : now;
  if (!plan) {
    jobs_.Publish(job,
                  absl::StrCat(kept,
                               " workers kept their stages in memory, "
                               "but not every stage at one step: "
                               "resuming from the checkpoint"),
                  now);
    return;
  }
  const std::string message = absl::StrCat(
      "every stage's state after step ", plan->step,
      " survives in memory (held by ", absl::StrJoin(plan->holders, ", "),
      "): resuming there, no checkpoint");
  job.memory_resume = std::move(plan);
  jobs_.Publish(job, message, now);
}

bool Controller::GrowReplicas(absl::Time now) {
  // Waiting jobs come first (FIFO).
  if (!jobs_.Waiting().empty()) return false;
  const std::vector<std::shared_ptr<WorkerRecord>> idle = workers_.Free(now);
  const int64_t free = static_cast<int64_t>(idle.size());
  if (free == 0) return false;
  for (JobRecord* job : jobs_.Running()) {
    const v1::JobSpec& spec = job->job.spec();
    // Not while the epoch still starts: its workers would keep nothing;
    // nor while a broken link's restart is held.
    // Nor once a stage has finished: it keeps nothing to resume from, and
    // the job would replay from its checkpoint.
    if (job->held_link_failure || job->merging ||
        job->replicas >= ReplicaCount(spec) ||
        job->status().step() <= job->start_step ||
        job->status().step() >= job->status().total_steps() ||
        std::find(job->finished.begin(), job->finished.end(), true) !=
            job->finished.end()) {
      continue;
    }
    const int64_t k = job->running_stages();
    const int64_t most = ElasticReplicas(spec, k, k * job->replicas + free);
    if (most <= job->replicas) continue;
    // The new replicas' stages must fit the free workers' memory: the most
    // that do (only counts the replica rules allow).
    std::vector<int64_t> balance;
    for (const v1::StageStatus& s : job->status().stages())
      balance.push_back(s.layer_end() - s.layer_begin());
    absl::StatusOr<StagePlan> stages = PlanStages(spec, k, balance);
    if (!stages.ok()) continue;
    int64_t r = most;
    for (std::string why; r > job->replicas; --r) {
      if (ElasticReplicas(spec, k, k * r) == r &&
          PlaceStages(RepeatPlan(*stages, r - job->replicas),
                      WorkerMemory(idle), &why)) {
        break;
      }
    }
    if (r <= job->replicas) continue;
    RestartReplicas(*job, "Resize",
                    absl::StrCat("growing from ", job->replicas, " to ", r,
                                 " replicas: free workers joined"),
                    nullptr, /*counted=*/false, now);
    return true;  // the free workers are spoken for
  }
  return false;
}

void Controller::EndJob(JobRecord& job, v1::JobState state,
                        std::string_view type, std::string_view reason,
                        const std::string& message, const WorkerRecord* except,
                        absl::Time now) {
  ReleaseStages(job, message, except);
  job.merging = false;
  job.parking_epoch = 0;
  job.memory_resume.reset();
  job.checkpointing.clear();
  MarkTerminal(&job.status(), state, type, reason, message, now);
  jobs_.Publish(job, message, now);
  job.recovery_began = absl::InfinitePast();  // no recovery to measure
  job.link_blame.reset();
  job.held_link_failure.reset();
  job.parked.clear();
  job.make_room = false;
  if (options_.metrics != nullptr) {
    options_.metrics->OnJobEnded(job.id());
    // A submit the store could not record is refused, not failed.
    if (state == v1::FAILED && reason != "NotStored") {
      options_.metrics->OnJobFailed();
    }
  }
  // What the job wrote and never committed goes with it: a cancelled job
  // kept a failed checkpoint's files until it was deleted.
  RemoveStaleFiles(job, /*ended=*/true);
}

JobRecord* Controller::ReportedJob(const WorkerRecord& worker,
                                   std::string_view what,
                                   const std::string& job_id, int64_t epoch,
                                   int64_t stage, int64_t replica) {
  JobRecord* job = jobs_.Find(job_id);
  std::string problem;
  if (job == nullptr) {
    problem = "the job is unknown";
  } else if (epoch != job->status().epoch()) {
    problem = absl::StrCat("the job is at epoch ", job->status().epoch());
  } else if (IsTerminal(job->status().state()) || job->merging) {
    problem = "the job has finished";
  } else if (job->status().state() != v1::RUNNING) {
    problem = "the job is restarting";
  } else if (worker.info.state() != v1::BUSY ||
             worker.info.job_id() != job_id ||
             worker.info.stage() != job->WorkerIndexOf(stage) ||
             worker.info.replica() != replica ||
             job->Slot(stage, replica) < 0) {
    problem = worker.info.state() == v1::BUSY
                  ? absl::StrCat("the worker runs stage ", worker.info.stage(),
                                 " of replica ", worker.info.replica(), " of ",
                                 worker.info.job_id())
                  : "the worker is idle";
  } else {
    // Any report is progress for the stall watchdog.
    job->stage_reported[job->Slot(stage, replica)] = Now();
    return job;
  }
  ++ignored_reports_;
  LogWarning(
      "ignored %s from worker %s for %s epoch %d stage %d replica %d: %s (%d "
      "reports ignored so far)",
      what, worker.id(), job_id, epoch, stage, replica, problem,
      ignored_reports_);
  return nullptr;
}

namespace {

// The loss of the step `p` reports: the last stage's own with one replica;
// with several, once the last stages of all have reported the step, their
// micro-batches' losses added in micro-batch order and divided by the
// batch's normalizer, as one pipeline adds them (the same bits).
std::optional<double> StepLoss(JobRecord& job, const v1::StepProgress& p) {
  if (job.replicas == 1) return p.loss();
  const int64_t m = MicroBatchCount(job.job.spec());
  std::map<int64_t, v1::MicroBatchLoss>& losses =
      job.micro_batch_losses[p.step()];
  for (const v1::MicroBatchLoss& l : p.micro_batch_losses()) {
    if (l.micro_batch() >= 0 && l.micro_batch() < m)
      losses[l.micro_batch()] = l;
  }
  if (static_cast<int64_t>(losses.size()) < m) return std::nullopt;
  double sum = 0;
  for (const auto& [mb, l] : losses) sum += l.loss_sum();
  job.micro_batch_losses.erase(job.micro_batch_losses.begin(),
                               job.micro_batch_losses.upper_bound(p.step()));
  if (!(p.loss_normalizer() > 0)) return std::nullopt;
  return sum / p.loss_normalizer();
}

// What in a progress report no stage can have measured: a loss or a time
// that is not a finite number, a negative time or size. Stored, it showed
// as loss=nan and step_seconds=-1 on the job; a stage whose loss is not
// finite reports a failure instead.
std::optional<std::string> ImpossibleFigure(const v1::StepProgress& p) {
  for (auto [name, v] :
       {std::pair{"loss", p.loss()}, std::pair{"accuracy", p.accuracy()},
        std::pair{"loss_normalizer", p.loss_normalizer()}}) {
    if (!std::isfinite(v)) return absl::StrCat(name, " ", v);
  }
  for (auto [name, v] : {std::pair{"step_seconds", p.step_seconds()},
                         std::pair{"busy_seconds", p.busy_seconds()},
                         std::pair{"bubble_seconds", p.bubble_seconds()},
                         std::pair{"update_seconds", p.update_seconds()}}) {
    if (!(std::isfinite(v) && v >= 0)) return absl::StrCat(name, " ", v);
  }
  if (p.peak_activation_bytes() < 0) {
    return absl::StrCat("peak_activation_bytes ", p.peak_activation_bytes());
  }
  for (const v1::MicroBatchLoss& l : p.micro_batch_losses()) {
    if (!std::isfinite(l.loss_sum())) {
      return absl::StrCat("the loss of micro-batch ", l.micro_batch(), " ",
                          l.loss_sum());
    }
  }
  return std::nullopt;
}

}  // namespace

void Controller::OnProgress(WorkerRecord& worker, const v1::StepProgress& p,
                            absl::Time now) {
  JobRecord* job = ReportedJob(worker, "progress", p.job_id(), p.epoch(),
                               p.stage(), p.replica());
  if (job == nullptr) return;
  v1::JobStatus& status = job->status();
  const int64_t slot = job->Slot(p.stage(), p.replica());
  // A step behind the stage's last report or past the end is no step this
  // epoch can have made.
  if (p.step() < job->stage_steps[slot] || p.step() > status.total_steps()) {
    ++ignored_reports_;
    LogWarning(
        "ignored progress of stage %d of %s from worker %s: step %d is not in "
        "[%d, %d]",
        p.stage(), p.job_id(), worker.id(), p.step(), job->stage_steps[slot],
        status.total_steps());
    return;
  }
  if (const std::optional<std::string> bad = ImpossibleFigure(p)) {
    ++ignored_reports_;
    LogWarning("ignored progress of stage %d of %s from worker %s: %s",
               p.stage(), p.job_id(), worker.id(), *bad);
    return;
  }
  job->stage_steps[slot] = p.step();
  const bool last_stage = p.stage() == job->running_stages() - 1;
  // The balancer measures one pipeline (it does not move replicas' layers).
  if (p.replica() == 0 &&
      !RecordStageTimes(*job, worker.id(),
                        worker.info.resources().probe_gflops(), p)) {
    ++ignored_reports_;
    LogWarning(
        "ignored the layer times of stage %d of %s from worker %s: "
        "not one finite time per layer of the stage",
        p.stage(), p.job_id(), worker.id());
  }
  // The step time gauges: measured with every step of the last stage, the
  // simulator's every kPredictEvery (it re-estimates the costs).
  if (job->step_seconds > 0 && last_stage && p.replica() == 0) {
    constexpr int64_t kPredictEvery = 20;
    CutPrediction prediction;
    if (job->step_reports % kPredictEvery == 0)
      prediction = PredictRunningCut(*job);
    const double predicted = prediction.step_seconds;
    if (predicted > 0) status.set_predicted_step_seconds(predicted);
    if (!prediction.bubbles.empty()) SendCutBubbles(*job, prediction.bubbles);
    if (options_.metrics != nullptr) {
      options_.metrics->ObserveStepTime(job->id(), job->step_seconds,
                                        predicted);
    }
  }
  if (std::optional<std::string> measured = MeasureRepartition(*job)) {
    LogInfo("job %s: %s", job->id(), *measured);
    jobs_.Publish(*job, *measured, now);
  }
  // The stage's last step as its worker measured it; watchers see it with
  // the next published change.
  for (v1::StageStatus& st : p.replica() == 0
                                 ? *status.mutable_stages()
                                 : *status.mutable_replica_stages()) {
    if (st.stage() != p.stage() || st.replica() != p.replica()) continue;
    st.set_step_seconds(p.step_seconds());
    st.set_busy_seconds(p.busy_seconds());
    st.set_bubble_seconds(p.bubble_seconds());
    st.set_peak_activation_bytes(p.peak_activation_bytes());
    st.set_data_plane(p.data_plane());
    st.set_data_plane_reason(
        std::string(Utf8Prefix(p.data_plane_reason(), 512)));
    st.set_segment_bytes(p.segment_bytes());
  }
  const int64_t step =
      *std::min_element(job->stage_steps.begin(), job->stage_steps.end());
  if (last_stage) {
    if (const std::optional<double> loss = StepLoss(*job, p)) {
      job->step_figures[p.step()] = {*loss, p.step_seconds()};
    }
  }
  // The step's own loss, once the slowest stage has completed it.
  std::optional<JobRecord::StepFigures> figures;
  if (auto it = job->step_figures.find(step); it != job->step_figures.end())
    figures = it->second;
  job->step_figures.erase(job->step_figures.begin(),
                          job->step_figures.upper_bound(step));
  if (step == status.step() && !figures) return;
  // With checkpoints, progress is a commit (a restart keeps it); without,
  // a step is the only measure there is.
  if (step > status.step() &&
      StepPlan::FromSpec(job->job.spec()).checkpoint_every() == 0) {
    job->restarts_without_progress = 0;
  }
  status.set_step(step);
  if (figures) {
    status.set_loss(figures->loss);
    if (options_.metrics != nullptr)
      options_.metrics->ObserveLoss(job->id(), figures->loss);
    if (figures->step_seconds > 0) {
      status.set_samples_per_second(
          static_cast<double>(job->job.spec().batch_size()) /
          figures->step_seconds);
    }
  }
  jobs_.Publish(*job,
                absl::StrFormat("step %d/%d, loss %.4f, %.1f samples/s", step,
                                status.total_steps(), status.loss(),
                                status.samples_per_second()),
                now);
}

void Controller::OnTrace(WorkerRecord& worker, const v1::StepTrace& t,
                         absl::Time now) {
  const JobRecord* job = ReportedJob(worker, "trace", t.job_id(), t.epoch(),
                                     t.stage(), t.replica());
  if (job == nullptr) return;
  // A step the job has, in time order: traces of steps -7 and 2^62 were
  // kept, and GetTrace then gave them as the stored range.
  if (t.step() < 0 || t.step() >= job->status().total_steps() ||
      t.end_unix_ns() < t.start_unix_ns()) {
    ++ignored_reports_;
    LogWarning(
        "ignored the trace of stage %d of %s from worker %s: step %d of [0, "
        "%d), from %d to %d ns",
        t.stage(), t.job_id(), worker.id(), t.step(),
        job->status().total_steps(), t.start_unix_ns(), t.end_unix_ns());
    return;
  }
  // Stages on other hosts stamp their own wall clock. A record that ends
  // after it arrived comes from a clock that runs ahead of this one by at
  // least the difference: say so once per worker, as a hint to check NTP.
  const absl::Duration ahead =
      absl::Nanoseconds(t.end_unix_ns()) - (now - absl::UnixEpoch());
  if (ahead > absl::Milliseconds(50) &&
      clock_ahead_warned_.insert(worker.id()).second) {
    LogWarning(
        "worker %s's clock runs at least %s ahead of the controller's; its "
        "timelines will not line up with other hosts' (is NTP running?)",
        worker.id(), ShortDuration(ahead));
  }
  v1::StepTrace kept = t;
  kept.set_worker_id(worker.id());
  traces_.Add(std::move(kept));
}

void Controller::OnFinished(WorkerRecord& worker, const v1::StageFinished& f,
                            absl::Time now) {
  JobRecord* job = ReportedJob(worker, "finished", f.job_id(), f.epoch(),
                               f.stage(), f.replica());
  if (job == nullptr) return;
  // Replica 0 writes the parameters every replica holds; the others only
  // say they are done.
  if (f.replica() > 0 && !f.parameters_path().empty()) {
    ++ignored_reports_;
    LogWarning(
        "ignored finished report of stage %d replica %d of %s: only "
        "replica 0 writes parameters",
        f.stage(), f.replica(), f.job_id());
    return;
  }
  if (f.replica() == 0 && f.parameters_path().empty()) {
    EndJob(*job, v1::FAILED, kFailed, "StageFailed",
           absl::StrCat("stage ", f.stage(), " (worker ", worker.id(),
                        ") finished without a parameters_path"),
           &worker, now);
    Reschedule(now);
    return;
  }
  // The merge reads this file and the final manifest lists it: it must be
  // the one the assignment named, never another file on the controller's
  // disk (path traversal).
  if (absl::Status ok = f.replica() > 0
                            ? absl::OkStatus()
                            : CheckFinishedReport(options_.checkpoint_dir, f);
      !ok.ok()) {
    ++ignored_reports_;
    LogWarning("ignored finished report of stage %d of %s from worker %s: %s",
               f.stage(), f.job_id(), worker.id(), ok.ToString());
    return;
  }
  const int64_t slot = job->Slot(f.stage(), f.replica());
  const int64_t running = static_cast<int64_t>(job->finished.size());
  job->finished[slot] = true;
  if (f.replica() == 0) job->finished_paths[f.stage()] = f.parameters_path();
  if (!f.evaluation_error().empty() &&
      (job->evaluation_error.empty() ||
       (f.evaluation_failed_here() && !job->evaluation_error_here))) {
    // A worker's words: bounded, as they are stored and shown.
    job->evaluation_error = std::string(Utf8Prefix(f.evaluation_error(), 1024));
    job->evaluation_error_here = f.evaluation_failed_here();
  }
  job->stage_steps[slot] = job->status().total_steps();
  if (f.replica() == 0 && f.stage() == job->running_stages() - 1 &&
      f.evaluation().counted() > 0) {
    if (absl::Status ok = CheckEvaluation(f.evaluation()); !ok.ok()) {
      ++ignored_reports_;
      LogWarning("ignored the final evaluation of %s from worker %s: %s",
                 job->id(), worker.id(), ok.ToString());
    } else {
      v1::Evaluation e = f.evaluation();
      e.set_step(job->status().total_steps());
      *job->status().mutable_evaluation() = e;
      KeepEvaluation(*job, e);
    }
  }
  const int64_t done =
      std::count(job->finished.begin(), job->finished.end(), true);
  if (done < running) {
    jobs_.Publish(
        *job,
        absl::StrCat(
            "stage ", f.stage(),
            job->replicas > 1 ? absl::StrCat(" of replica ", f.replica()) : "",
            " finished (", done, " of ", running, ")"),
        now);
    return;
  }
  // Every stage is done: free the workers now and merge off the lock.
  job->merging = true;
  job->status().set_step(job->status().total_steps());
  // Its steps are over: their times go, as a failed or cancelled job's do
  // (EndJob), and as a restarted controller shows it (a succeeded job kept
  // them until the controller restarted).
  if (options_.metrics != nullptr) options_.metrics->OnJobEnded(job->id());
  for (const v1::StageStatus* stage : job->AllStages()) {
    std::shared_ptr<WorkerRecord> w = workers_.Find(stage->worker_id());
    if (w != nullptr && w->info.job_id() == job->id()) {
      WorkerRegistry::MarkIdle(*w);
    }
  }
  EnqueueIo([this, id = job->id()] { MergeIo(id); });
  const std::string stages = absl::StrCat(
      StagesText(job->status().running_stages(),
                 VirtualStageCount(job->job.spec())),
      job->replicas > 1 ? absl::StrCat(" x ", job->replicas, " replicas") : "");
  jobs_.Publish(
      *job,
      absl::StrCat(running == 1 ? "the stage" : absl::StrCat("all ", stages),
                   " finished; merging their parameters"),
      now);
  Reschedule(now);
}

void Controller::OnFailed(WorkerRecord& worker, const v1::StageFailed& f,
                          absl::Time now) {
  // A stage that could not write its checkpoint closes its links, and its
  // neighbour's LinkFailed often arrives first: the restart it made
  // counted against max_restarts, which a full store must not.
  if (BlameFullStore(f, now)) return;
  // The stage fails before it reports the step: gpipe_loss never showed
  // the NaN, and the GpipeLossNotFinite alert could not fire. The job's
  // loss says it instead, until the job is deleted.
  if (f.reason() == "LossNotFinite" && options_.metrics != nullptr &&
      jobs_.Find(f.job_id()) != nullptr) {
    options_.metrics->ObserveLoss(f.job_id(),
                                  std::numeric_limits<double>::quiet_NaN());
  }
  // A permanent failure (a loss that is not finite, bad data) of the epoch
  // the job just left: its neighbour's lost link, reported first, restarted
  // the job, and the replay is bitwise the same run, so it would fail the
  // same way after replaying the steps since the checkpoint.
  // It comes while the job waits to restart (the same epoch, no longer
  // running) or after it restarted (the next epoch).
  if (JobRecord* old = jobs_.Find(f.job_id());
      old != nullptr && f.permanent() && !IsTerminal(old->status().state()) &&
      !old->merging &&
      (f.epoch() + 1 == old->status().epoch() ||
       (f.epoch() == old->status().epoch() &&
        old->status().state() != v1::RUNNING))) {
    const std::string message =
        absl::StrCat("stage ", f.stage(), " (worker ", worker.id(),
                     ") failed in epoch ", f.epoch(), ": ", f.message());
    EndJob(*old, v1::FAILED, kFailed,
           f.reason().empty() ? "StageFailed" : f.reason(), message,
           /*except=*/nullptr, now);
    Reschedule(now);
    return;
  }
  JobRecord* job = ReportedJob(worker, "failure", f.job_id(), f.epoch(),
                               f.stage(), f.replica());
  if (job == nullptr) return;
  // A permanent failure (the loss is not finite, bad data) would fail
  // again on replay; anything else (a lost link, a checkpoint that could not
  // be written or read) may pass on a restart.
  const std::string message = absl::StrCat(
      "stage ", f.stage(),
      job->replicas > 1 ? absl::StrCat(" of replica ", f.replica()) : "",
      " (worker ", worker.id(), ") failed: ", f.message());
  const std::string reason = !f.reason().empty() ? f.reason() : "StageFailed";
  // The other end of a held broken link reports the same break: the
  // restart to come reported it already (before the hold, the job was
  // restarting by then and such reports were fenced off).
  if (reason == "LinkFailed" && job->held_link_failure &&
      job->held_link_failure->epoch == f.epoch()) {
    LogInfo("job %s: %s (the link failure is held already)", job->id(),
            message);
    return;
  }
  // A broken link may be the neighbour's fault (a stopped process keeps its
  // lease for a while): neither neighbour gets a stage again before it
  // proves alive with a message.
  // Who is at the link's other end, for the message: the reporter's stage
  // did not fail, its link did (a stopped neighbour's restart named the
  // healthy reporter as the stage that "failed").
  std::vector<std::string> neighbours;
  if (reason == "LinkFailed") {
    // The worker's stages: one, or an interleaved schedule's chunks (any of
    // which may have lost the link).
    const int64_t me = job->WorkerIndexOf(f.stage());
    const int64_t k = job->running_stages();
    const auto mine = [&](int64_t stage) {
      return stage >= 0 && stage < k && job->WorkerIndexOf(stage) == me;
    };
    for (const v1::StageStatus* s : job->AllStages()) {
      // Its neighbours in its pipeline, and its stage's other replicas.
      const bool neighbour = s->replica() == f.replica()
                                 ? !mine(s->stage()) && (mine(s->stage() - 1) ||
                                                         mine(s->stage() + 1))
                                 : s->stage() == f.stage();
      if (!neighbour) continue;
      if (std::shared_ptr<WorkerRecord> n = workers_.Find(s->worker_id())) {
        n->suspect_since = now;
      }
      neighbours.push_back(absl::StrCat(
          "stage ", s->stage(),
          job->replicas > 1 ? absl::StrCat(" of replica ", s->replica()) : "",
          " (worker ", s->worker_id(), ")"));
    }
  }
  if (reason == kCheckpointStoreFull || reason == "CheckpointFailed") {
    if (options_.metrics != nullptr) {
      options_.metrics->OnCheckpointFailure(
          job->id(), reason == kCheckpointStoreFull ? "store_full" : "write");
    }
  }
  // Room is made once the restart has checked which checkpoint it restores
  // (CheckRestorePointIo): dropped now, the oldest might have been the only
  // intact one.
  if (reason == kCheckpointStoreFull) job->make_room = true;
  if (reason == "LinkFailed" && !f.permanent()) {
    // Its cause may be on its way (HeldLinkFailure); the lease thread's
    // tick restarts the job for the link if nothing else does first. Who
    // else ran the epoch, for the blame after that restart (which clears
    // the stages).
    std::set<std::string> others;
    for (const v1::StageStatus* s : job->AllStages()) {
      if (s->worker_id() != worker.id()) others.insert(s->worker_id());
    }
    const std::string lost =
        neighbours.empty()
            ? message
            : absl::StrCat("stage ", f.stage(),
                           job->replicas > 1
                               ? absl::StrCat(" of replica ", f.replica())
                               : "",
                           " (worker ", worker.id(), ") lost its link to ",
                           absl::StrJoin(neighbours, " or "),
                           f.message().empty() ? "" : ": ", f.message());
    job->held_link_failure =
        JobRecord::HeldLinkFailure{now + kLinkFailureHold, f.epoch(),
                                   worker.id(), std::move(others), lost};
    return;
  }
  if (f.permanent()) {
    EndJob(*job, v1::FAILED, kFailed, reason, message, &worker, now);
  } else if (ReplicaCount(job->job.spec()) > 1 && reason != "ResumeFailed") {
    // A resume from memory that failed falls back to the checkpoint.
    RestartReplicas(*job, reason, message, &worker,
                    /*counted=*/reason != kCheckpointStoreFull, now);
  } else {
    // A full checkpoint store is the cluster's condition, not the job's
    // fault: the job waits (with the growing backoff) without spending its
    // restarts.
    RestartOrFail(*job, reason, message, &worker,
                  /*counted=*/reason != kCheckpointStoreFull, now);
  }
  Reschedule(now);
}

bool Controller::RestartForHeldLinkFailure(JobRecord& job, absl::Time now) {
  if (!job.held_link_failure || now < job.held_link_failure->until) {
    return false;
  }
  JobRecord::HeldLinkFailure held = *std::exchange(job.held_link_failure, {});
  if (held.epoch != job.status().epoch() ||
      job.status().state() != v1::RUNNING || job.merging) {
    return false;
  }
  const std::shared_ptr<WorkerRecord> reporter = workers_.Find(held.worker_id);
  if (ReplicaCount(job.job.spec()) > 1) {
    RestartReplicas(job, "LinkFailed", held.message, reporter.get(),
                    /*counted=*/true, now);
  } else {
    RestartOrFail(job, "LinkFailed", held.message, reporter.get(),
                  /*counted=*/true, now);
  }
  if (job.status().state() == v1::RESTARTING) {
    job.link_blame = JobRecord::LinkBlame{
        now, held.epoch, std::move(held.workers), std::move(held.message)};
  }
  return true;
}

bool Controller::BlameFullStore(const v1::StageFailed& f, absl::Time now) {
  JobRecord* job = jobs_.Find(f.job_id());
  if (job == nullptr || f.reason() != kCheckpointStoreFull ||
      !job->link_blame || job->link_blame->epoch != f.epoch() ||
      IsTerminal(job->status().state())) {
    return false;
  }
  v1::JobStatus& status = job->status();
  if (status.restarts() > 0) status.set_restarts(status.restarts() - 1);
  job->make_room = true;
  const std::string cause = absl::StrCat(
      "stage ", f.stage(), " could not write its checkpoint: ", f.message(),
      " (", job->link_blame->message, ")");
  if (options_.metrics != nullptr) {
    options_.metrics->OnCheckpointFailure(job->id(), "store_full");
  }
  Reattribute(*job, kCheckpointStoreFull, cause, /*uncounted=*/true, now);
  jobs_.Publish(*job, absl::StrCat(cause, "; the restart is not counted"), now);
  return true;
}

std::string Controller::Reattribute(JobRecord& job, std::string_view reason,
                                    const std::string& cause, bool uncounted,
                                    absl::Time now) {
  v1::JobStatus& status = job.status();
  std::string text = cause;
  if (const v1::Condition* running = FindCondition(status, kRunning)) {
    std::vector<std::pair<std::string, std::string>> edits = {
        {job.link_blame->message, cause}};
    if (uncounted) {
      edits.emplace_back(absl::StrCat("restart ", status.restarts() + 1, " of ",
                                      MaxRestarts(job.job.spec()), ": "),
                         "");
    }
    text = absl::StrReplaceAll(running->message(), edits);
  }
  if (status.state() == v1::RESTARTING) {
    SetCondition(&status, kRunning, false, reason, text, now);
  }
  job.link_blame.reset();
  return text;
}

void Controller::BlameLostWorker(const WorkerRecord& worker,
                                 const std::string& why, absl::Time now) {
  for (JobRecord* job : jobs_.Waiting()) {
    if (!job->link_blame || job->status().state() != v1::RESTARTING ||
        job->link_blame->epoch != job->status().epoch()) {
      continue;
    }
    JobRecord::LinkBlame& blame = *job->link_blame;
    // A stopped worker is lost when its lease expires, up to a heartbeat
    // timeout after its neighbour's link broke.
    if (now - blame.at > options_.heartbeat_timeout + absl::Seconds(2)) {
      job->link_blame.reset();
      continue;
    }
    if (!blame.workers.contains(worker.id())) continue;
    const std::string cause =
        absl::StrCat("worker ", worker.id(), " at ", worker.info.address(),
                     " was lost: ", why, " (", blame.message, ")");
    jobs_.Publish(
        *job, Reattribute(*job, "WorkerLost", cause, /*uncounted=*/false, now),
        now);
  }
}

void Controller::OnEvaluated(WorkerRecord& worker, const v1::StageEvaluated& r,
                             absl::Time now) {
  JobRecord* job =
      ReportedJob(worker, "evaluation", r.job_id(), r.epoch(), r.stage(),
                  /*replica=*/0);
  if (job == nullptr) return;
  const v1::JobSpec& spec = job->job.spec();
  absl::Status ok =
      r.stage() != static_cast<int64_t>(job->finished_paths.size()) - 1
          ? absl::InvalidArgumentError(
                absl::StrCat("stage ", r.stage(), " is not the last stage"))
          : CheckPeriodicEvaluation(r.evaluation(), StepPlan::FromSpec(spec));
  if (!ok.ok()) {
    ++ignored_reports_;
    LogWarning("ignored evaluation of stage %d of %s from worker %s: %s",
               r.stage(), r.job_id(), worker.id(), ok.ToString());
    return;
  }
  KeepEvaluation(*job, r.evaluation());
  const v1::Evaluation& e = r.evaluation();
  jobs_.Publish(*job,
                absl::StrFormat("evaluation at step %d: test loss %.4f, "
                                "accuracy %.4f over %d targets",
                                e.step(), e.loss(), e.accuracy(), e.counted()),
                now);
}

void Controller::KeepEvaluation(JobRecord& job, const v1::Evaluation& e) {
  RecordEvaluation(&job.status(), e);
  if (options_.metrics != nullptr) {
    options_.metrics->ObserveEvaluation(job.id(), e.loss(), e.accuracy());
  }
}

namespace {

// The manifest tells a restore which layers each file holds: they must be
// the ones the stage was assigned.
absl::Status SameLayers(const JobRecord& job, const v1::StageCheckpointed& c) {
  for (const v1::StageStatus& stage : job.status().stages()) {
    if (stage.stage() != c.stage()) continue;
    if (stage.layer_begin() == c.layer_begin() &&
        stage.layer_end() == c.layer_end()) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "layers [", c.layer_begin(), ", ", c.layer_end(), ") are not stage ",
        c.stage(), "'s [", stage.layer_begin(), ", ", stage.layer_end(), ")"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("stage ", c.stage(), " is not running"));
}

}  // namespace

void Controller::OnCheckpointed(WorkerRecord& worker,
                                const v1::StageCheckpointed& c,
                                absl::Time now) {
  JobRecord* job =
      ReportedJob(worker, "checkpoint", c.job_id(), c.epoch(), c.stage(),
                  /*replica=*/0);
  if (job == nullptr) return;
  const v1::JobSpec& spec = job->job.spec();
  if (absl::Status ok = CheckCheckpointReport(options_.checkpoint_dir, c,
                                              StepPlan::FromSpec(spec));
      !ok.ok() || !(ok = SameLayers(*job, c)).ok()) {
    ++ignored_reports_;
    LogWarning("ignored checkpoint report of stage %d of %s: %s", c.stage(),
               c.job_id(), ok.ToString());
    return;
  }
  // A stage checkpoints a step it has reported (its progress precedes the
  // report on the stream), and after the newest committed one: a report of
  // a step never reached was committed, and an older one moved the list
  // back and left the newer directory behind.
  const v1::JobStatus& status = job->status();
  const int64_t reached = job->stage_steps[job->Slot(c.stage(), 0)];
  const int64_t newest =
      status.checkpoints().empty()
          ? -1
          : status.checkpoints(status.checkpoints_size() - 1).step();
  if (c.step() > reached || c.step() <= newest) {
    ++ignored_reports_;
    LogWarning(
        "ignored checkpoint report of stage %d of %s: step %d is %s", c.stage(),
        c.job_id(), c.step(),
        c.step() > reached
            ? absl::StrCat("past the stage's reported progress (step ", reached,
                           ")")
            : absl::StrCat("not after the newest committed checkpoint (step ",
                           newest, ")"));
    return;
  }
  const size_t running = job->finished_paths.size();
  std::vector<v1::StageCheckpointed>& reports = job->checkpointing[c.step()];
  reports.resize(running);
  reports[c.stage()] = c;
  for (const v1::StageCheckpointed& r : reports) {
    if (r.path().empty()) return;  // not every stage has written it yet
  }
  std::vector<v1::StageCheckpointed> all = std::move(reports);
  job->checkpointing.erase(job->checkpointing.begin(),
                           job->checkpointing.upper_bound(c.step()));
  EnqueueIo(
      [this, id = job->id(), epoch = job->status().epoch(),
       all = std::move(all), spec = job->job.spec()]() mutable {
        CommitCheckpointIo(id, epoch, std::move(all), spec);
      },
      IoTask::kFinishOnStop);
}

void Controller::CommitCheckpointIo(const std::string& job_id, int64_t epoch,
                                    std::vector<v1::StageCheckpointed> reports,
                                    const v1::JobSpec& spec) {
  const int64_t step = reports.front().step();
  const size_t running = reports.size();
  absl::Status verified = VerifyCheckpointReports(reports);
  absl::StatusOr<v1::CheckpointRef> ref =
      verified.ok() ? CommitCheckpoint(options_.checkpoint_dir, job_id, epoch,
                                       reports, spec)
                    : verified;
  std::vector<std::string> dropped;
  {
    absl::MutexLock lock(&mu_);
    if (!ref.ok()) {
      // The job goes on: the previous checkpoint stays the restore point.
      LogError("job %s: cannot commit the checkpoint of step %d: %s", job_id,
               step, ref.status().ToString());
      if (options_.metrics != nullptr && jobs_.Find(job_id) != nullptr) {
        options_.metrics->OnCheckpointFailure(job_id, "commit");
      }
      return;
    }
    JobRecord* job = jobs_.Find(job_id);
    // A job that started over meanwhile replays this step and commits it
    // again (its restore point may be chosen already); one that ended, or
    // whose stages all finished, has its final parameters.
    if (job == nullptr || job->status().epoch() != epoch ||
        job->status().state() != v1::RUNNING || job->merging) {
      LogInfo("job %s: the checkpoint of step %d of epoch %d is superseded",
              job_id, step, epoch);
      // Its manifest, listed nowhere, would keep its files from every
      // cleanup (RemoveStaleStageFiles passes over committed directories).
      // Tasks run one at a time in order, so no later commit of this step
      // has written its own yet.
      bool listed = job == nullptr;  // a deleted job's folder goes whole
      if (job != nullptr) {
        for (const v1::CheckpointRef& c : job->status().checkpoints())
          listed = listed || c.manifest_path() == ref->manifest_path();
      }
      if (!listed) {
        std::error_code error;
        std::filesystem::remove(ref->manifest_path(), error);
        std::filesystem::remove(
            std::filesystem::path(ref->manifest_path()).parent_path() /
                storage::kJobSpecName,
            error);
      }
      return;
    }
    const absl::Time now = Now();
    job->restarts_without_progress = 0;  // progress that survives a restart
    dropped = KeepCheckpoints(&job->status(), *ref,
                              job->status().checkpoint_keep() > 0
                                  ? job->status().checkpoint_keep()
                                  : job->job.spec().checkpoint().keep());
    if (options_.metrics != nullptr) options_.metrics->OnCheckpoint();
    // (In workers: an interleaved schedule's run v stages each.)
    const int64_t v = VirtualStageCount(job->job.spec());
    jobs_.Publish(
        *job,
        absl::StrCat("checkpoint of step ", step, " committed (",
                     StagesText(static_cast<int64_t>(running), v), ")"),
        now);
    // Elastic: a job running short grows back at a checkpoint boundary
    // once the workers it lacks are free.
    const int64_t workers = static_cast<int64_t>(running) / v;
    const int64_t missing = job->stages - workers;
    if (job->held_link_failure) {
      // Broken: the held restart comes first, and counts.
    } else if (missing > 0 &&
               static_cast<int64_t>(workers_.Free(now).size()) >= missing) {
      RestartOrFail(
          *job, "Resize",
          absl::StrCat(
              "growing back from ", workers, " to ", job->stages,
              v > 1 ? absl::StrCat(" workers of ", v, " chunks") : " stages"),
          nullptr, /*counted=*/false, now);
      Reschedule(now);
    } else {
      Rebalance(*job, step, now);
    }
    Changed();
  }
  RemoveCheckpointDirs(dropped);
}

void Controller::Rebalance(JobRecord& job, int64_t step, absl::Time now) {
  // What each attached worker's stages may hold, read here under mu_ (the
  // balancer's callback runs inside PlanRepartition).
  std::map<std::string, int64_t> memory;
  for (const std::shared_ptr<WorkerRecord>& w : workers_.All()) {
    memory[w->id()] = w->info.resources().memory_bytes();
  }
  std::string why;
  std::optional<v1::Repartition> r = PlanRepartition(
      job, step,
      [&memory](const std::string& id) -> int64_t {
        auto it = memory.find(id);
        return it == memory.end() ? 0 : it->second;
      },
      now, &why);
  if (!r) {
    if (!why.empty()) {
      LogInfo("job %s: keeping the cut at step %d: %s", job.id(), step, why);
    }
    return;
  }
  if (options_.metrics != nullptr) options_.metrics->OnRepartition(r->reason());
  const std::string message = absl::StrCat(
      "re-partitioning (", r->reason(), "): layers per stage ",
      absl::StrJoin(r->old_balance(), ","), " -> ",
      absl::StrJoin(r->new_balance(), ","), " on ",
      absl::StrJoin(r->workers(), ", "),
      absl::StrFormat(", %.1f ms a step, expected %.1f (compute %.1f -> "
                      "%.1f ms predicted)",
                      r->measured_old_seconds() * 1e3,
                      ExpectedStepSeconds(r->predicted_old_seconds(),
                                          r->predicted_new_seconds(),
                                          r->measured_old_seconds()) *
                          1e3,
                      r->predicted_old_seconds() * 1e3,
                      r->predicted_new_seconds() * 1e3));
  LogInfo("job %s: %s", job.id(), message);
  *job.status().add_repartitions() = *std::move(r);
  job.measuring_repartition = true;
  job.revert_pending = false;
  RestartOrFail(job, "Rebalance", message, nullptr, /*counted=*/false, now);
  Reschedule(now);
}

void Controller::CheckRestorePointIo(
    const std::string& job_id,
    const std::vector<v1::CheckpointRef>& committed) {
  const RestorePoint point = CheckRestorePoint(committed);
  absl::MutexLock lock(&mu_);
  JobRecord* job = jobs_.Find(job_id);
  if (job == nullptr ||
      job->restore_check != JobRecord::RestoreCheck::kChecking) {
    return;
  }
  const v1::JobState state = job->status().state();
  if (state != v1::PENDING && state != v1::RESTARTING) {
    job->restore_check = JobRecord::RestoreCheck::kNeeded;  // ended meanwhile
    return;
  }
  const absl::Time now = Now();
  const int64_t corrupt = DropUnusable(job_id, &job->status(), point);
  if (corrupt > 0) {
    corrupt_checkpoints_ += corrupt;
    if (options_.metrics != nullptr) {
      options_.metrics->OnCorruptCheckpoints(corrupt);
    }
    // On the job's status too, not only in the controller's log and the
    // events: a resume that said "from the checkpoint of step N" and then
    // trained from step 0 told the user nothing.
    const std::string message = absl::StrCat(
        corrupt, " corrupt checkpoint", corrupt > 1 ? "s" : "",
        " dropped (the newest, of step ", point.unusable.front().first.step(),
        ": ", point.unusable.front().second.message(), "); restoring ",
        point.chosen
            ? absl::StrCat("the checkpoint of step ", point.chosen->step())
            : std::string("from the start: every checkpoint was unusable"));
    job->status().set_step(point.chosen ? point.chosen->step()
                                        : InitialStep(job->job.spec()));
    SetCondition(&job->status(), kRestored, point.chosen.has_value(),
                 "CorruptCheckpoints", message, now);
    jobs_.Publish(*job, message, now);
  }
  // DropUnusable took the corrupt ones: the newest left is the chosen.
  MakeRoomForCheckpoint(*job, now);
  job->restore_point = point.chosen;
  job->restore_check = JobRecord::RestoreCheck::kChecked;
  Reschedule(now);
  Changed();
}

uint64_t Controller::EnqueueIo(std::function<void()> task, IoTask kind) {
  const uint64_t seq = ++io_queued_;
  io_pending_.insert(seq);
  if (kind == IoTask::kLong) {
    long_io_tasks_.push_back({std::move(task), kind, seq});
  } else if (kind == IoTask::kUrgent) {
    io_tasks_.push_front({std::move(task), kind, seq});
  } else {
    io_tasks_.push_back({std::move(task), kind, seq});
  }
  Changed();
  return seq;
}

void Controller::WaitIo(uint64_t seq, absl::Duration most) {
  absl::MutexLock lock(&mu_);
  const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !io_pending_.contains(seq) || stopping_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&done), most);
}

void Controller::FlushIo() {
  absl::MutexLock lock(&mu_);
  const uint64_t queued = io_queued_;
  const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return io_pending_.empty() || *io_pending_.begin() > queued || stopping_;
  };
  mu_.Await(absl::Condition(&done));
}

void Controller::IoLoop(std::deque<QueuedIo>* tasks) {
  for (;;) {
    QueuedIo task;
    {
      absl::MutexLock lock(&mu_);
      while (tasks->empty() && !stopping_) changed_.Wait(&mu_);
      if (stopping_) {
        // Checkpoints the stages reported are committed before the
        // controller stops (a restart then resumes from them); merges,
        // restore and content checks run again after the restart.
        while (!tasks->empty() &&
               tasks->front().kind != IoTask::kFinishOnStop) {
          io_pending_.erase(tasks->front().seq);
          tasks->pop_front();
        }
        if (tasks->empty()) return;
      }
      task = std::move(tasks->front());
      tasks->pop_front();
    }
    task.run();
    absl::MutexLock lock(&mu_);
    io_pending_.erase(task.seq);
  }
}

void Controller::LeaseLoop() {
  // Short enough for the restart settle time and the elastic grace period
  // to end on time.
  const absl::Duration period =
      std::clamp(options_.heartbeat_timeout / 4, absl::Milliseconds(10),
                 absl::Milliseconds(100));
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // A restarting job is scheduled the moment its settle time ends, not up
    // to a period later: nothing else wakes this loop after a failure.
    absl::Duration wait = period;
    const absl::Time before = Now();
    for (const JobRecord* job : jobs_.Waiting()) {
      if (job->not_before > before)
        wait = std::min(wait, job->not_before - before);
    }
    const auto slept_from = std::chrono::steady_clock::now();
    changed_.WaitWithTimeout(&mu_, wait);
    if (stopping_ || shutting_down_) continue;
    // A controller that did not run (a stopped process, a paused VM) cannot
    // tell the workers' silence from its own: leases start again from now,
    // so no worker is detached for the controller's pause (a pause of 90 s
    // detached every worker, and the job spent a restart).
    const absl::Duration slept =
        absl::FromChrono(std::chrono::steady_clock::now() - slept_from);
    if (slept > wait + options_.heartbeat_timeout / 2) {
      const absl::Time now = Now();
      LogWarning(
          "the controller did not run for %s: the workers' leases "
          "start again from now",
          ShortDuration(slept - wait));
      for (const std::shared_ptr<WorkerRecord>& w : workers_.All())
        w->last_heartbeat = std::max(w->last_heartbeat, now);
    }
    if (TickLocked(Now())) Changed();
  }
}

void Controller::Tick(absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  if (TickLocked(now)) Changed();
}

namespace {

absl::Duration StallTimeout(const JobRecord& job) {
  const int64_t ms = job.job.spec().pipeline().stall_timeout_ms();
  if (ms > 0) return absl::Milliseconds(ms);
  double slowest = 0;
  for (const v1::StageStatus& s : job.status().stages()) {
    slowest = std::max(slowest, s.step_seconds());
  }
  // The first step of an epoch also connects the stages, opens the data
  // and restores the checkpoint.
  if (slowest <= 0) return kFirstStepStall;
  return std::max(kMinStall, absl::Seconds(20 * slowest));
}

}  // namespace

bool Controller::CheckStalled(JobRecord& job, absl::Time now) {
  if (job.stage_reported.empty()) return false;
  const absl::Time oldest =
      *std::min_element(job.stage_reported.begin(), job.stage_reported.end());
  const absl::Duration timeout = StallTimeout(job);
  if (now - oldest <= timeout) return false;
  // The stage silent the longest holds the others; when several are as
  // silent (nobody could report), each is suspect.
  std::string blamed;
  // Once per worker, however many of its stages (chunks) were silent.
  std::set<std::string> quarantined;
  for (const v1::StageStatus* s : job.AllStages()) {
    const int64_t slot = job.Slot(s->stage(), s->replica());
    if (slot < 0 || slot >= static_cast<int64_t>(job.stage_reported.size()) ||
        job.stage_reported[slot] != oldest) {
      continue;
    }
    absl::StrAppend(
        &blamed, blamed.empty() ? "" : ", ", "stage ", s->stage(),
        job.replicas > 1 ? absl::StrCat(" of replica ", s->replica()) : "",
        " (worker ", s->worker_id(), ")");
    if (!quarantined.insert(s->worker_id()).second) continue;
    if (std::shared_ptr<WorkerRecord> w = workers_.Find(s->worker_id())) {
      ++w->quarantines;
      w->quarantined_until =
          now + DoublingBackoff(kQuarantine, w->quarantines, kMaxQuarantine);
      LogWarning("worker %s quarantined until %s: it stalled job %s", w->id(),
                 absl::FormatTime(w->quarantined_until), job.id());
    }
  }
  RestartOrFail(job, "StageStalled",
                absl::StrCat(blamed, " reported nothing for ",
                             ShortDuration(now - oldest), " (stall timeout ",
                             ShortDuration(timeout), ")"),
                nullptr, /*counted=*/true, now);
  return true;
}

bool Controller::TickLocked(absl::Time now) {
  bool changed = false;
  for (const std::shared_ptr<WorkerRecord>& worker :
       workers_.Expired(now, options_.heartbeat_timeout)) {
    const std::string why = absl::StrCat(
        "no heartbeat for ", ShortDuration(now - worker->last_heartbeat),
        " (timeout ", ShortDuration(options_.heartbeat_timeout), ")");
    LoseWorker(worker,
               absl::UnavailableError(absl::StrCat("lease expired: ", why)),
               why, /*disconnect=*/true, now);
    changed = true;
  }
  for (JobRecord* job : jobs_.Running()) {
    if (RestartForHeldLinkFailure(*job, now) || CheckStalled(*job, now)) {
      changed = true;
    }
  }
  if (GrowReplicas(now)) {
    Reschedule(now);
    changed = true;
  }
  // Retention: ended jobs go some time after they ended.
  if (options_.job_retention > absl::ZeroDuration()) {
    std::vector<std::string> expired;
    for (const JobRecord* job : jobs_.NewestFirst()) {
      if (IsTerminal(job->status().state()) && job->status().has_finished() &&
          FromTimestamp(job->status().finished()) + options_.job_retention <
              now) {
        expired.push_back(job->id());
      }
    }
    for (const std::string& id : expired) {
      RemoveJob(id, absl::StrCat("as it ended more than --job_retention ",
                                 absl::FormatDuration(options_.job_retention),
                                 " ago"));
    }
    if (!expired.empty()) changed = true;
  }
  // The elastic grace period of a waiting job runs out without any event.
  if (!jobs_.Waiting().empty()) {
    Reschedule(now);
    changed = true;
  }
  return changed;
}

void Controller::MergeIo(const std::string& id) {
  int64_t epoch = 0;
  std::vector<std::string> paths;
  std::string out_path;
  std::map<std::string, std::string> metadata;
  int64_t step = 0;
  std::vector<v1::StageCheckpointed> stages;
  v1::JobSpec spec;
  {
    absl::MutexLock lock(&mu_);
    JobRecord* job = jobs_.Find(id);
    if (job == nullptr || !job->merging) return;
    epoch = job->status().epoch();
    paths = job->finished_paths;
    out_path = storage::MergedModelPath(
        storage::JobCheckpointDir(options_.checkpoint_dir, id));
    step = job->status().step();
    metadata = ModelFileMetadata(job->job.spec(), step);
    spec = job->job.spec();
    for (const v1::StageStatus& stage : job->status().stages()) {
      if (stage.stage() < 0 ||
          stage.stage() >= static_cast<int64_t>(paths.size())) {
        continue;
      }
      v1::StageCheckpointed& s = stages.emplace_back();
      s.set_stage(stage.stage());
      s.set_layer_begin(stage.layer_begin());
      s.set_layer_end(stage.layer_end());
      s.set_path(paths[stage.stage()]);
    }
  }
  // The final parameters are committed (hashed, with a manifest) but not
  // listed among the checkpoints: they hold no optimizer state and no step
  // to continue from, and listing them dropped the oldest real checkpoint
  // kept. The model file is how a user takes them.
  absl::Status merged = absl::OkStatus();
  if (!paths.empty()) {
    merged = CommitFinalParameters(options_.checkpoint_dir, id, epoch, step,
                                   std::move(stages), spec)
                 .status();
  }
  if (merged.ok()) merged = MergeStageParameters(paths, out_path, metadata);
  if (merged.ok()) {
    absl::StatusOr<std::string> sha = storage::Sha256File(out_path);
    merged = sha.ok() ? storage::WriteFileAtomically(
                            storage::ModelDigestPath(out_path), *sha + "\n")
                      : sha.status();
  }
  {
    const absl::Time now = Now();
    absl::MutexLock lock(&mu_);
    JobRecord* job = jobs_.Find(id);
    if (job == nullptr || !job->merging || job->status().epoch() != epoch) {
      return;  // cancelled meanwhile
    }
    job->merging = false;
    if (!merged.ok()) {
      const std::string message = absl::StrCat(
          "cannot merge the stages' parameters: ", merged.message());
      MarkTerminal(&job->status(), v1::FAILED, kFailed, "MergeFailed", message,
                   now);
      jobs_.Publish(*job, message, now);
      if (options_.metrics != nullptr) options_.metrics->OnJobFailed();
    } else {
      job->status().set_model_path(out_path);
      const v1::Evaluation& e = job->status().evaluation();
      std::string message = absl::StrFormat(
          "model at %s; test loss %.4f, accuracy %.4f over %d targets",
          out_path, e.loss(), e.accuracy(), e.counted());
      std::string reason = "AllStagesFinished";
      if (!job->evaluation_error.empty()) {
        // The training is done and its model written: the job succeeded,
        // without the evaluation it could not finish.
        job->status().clear_evaluation();
        job->status().set_evaluation_error(job->evaluation_error);
        message = absl::StrCat(
            "model at ", out_path,
            "; the final evaluation failed: ", job->evaluation_error);
        reason = "FinalEvaluationFailed";
      }
      MarkTerminal(&job->status(), v1::SUCCEEDED, kComplete, reason, message,
                   now);
      jobs_.Publish(*job, message, now);
    }
    Changed();
  }
}

}  // namespace gpipe::controller
