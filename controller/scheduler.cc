#include "controller/scheduler.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/balancer.h"
#include "controller/job_status.h"
#include "controller/placement.h"
#include "controller/recovery.h"
#include "controller/replica_resume.h"
#include "services/core/log.h"
#include "services/core/strings.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/partitioner.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/simulator.h"
#include "services/security/stream_key.h"
#include "services/storage/checkpoint_layout.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;

constexpr std::string_view kWaitingForWorkers = "WaitingForWorkers";

// Assigns `job` to `workers` (stage i of replica r on workers[r * K + i];
// a schedule with chunks places stage i on workers[WorkerOfStage(i)], W
// workers each running its v chunks) cut by `balance` (K entries, K = W x v
// when interleaved): epoch, restore point, messages. False when no stream key
// could be made: it has failed, and the workers are still free.
bool Start(JobTable& jobs, JobRecord& job,
           const std::vector<std::shared_ptr<WorkerRecord>>& workers,
           const std::vector<int64_t>& balance,
           const std::string& checkpoint_dir, v1::CheckpointTransport transport,
           absl::Time now) {
  const v1::JobSpec& spec = job.job.spec();
  const int64_t k = static_cast<int64_t>(balance.size());
  const int64_t v = VirtualStageCount(spec);
  const ScheduleKind schedule = ScheduleFromSpec(spec.pipeline().schedule());
  const int64_t replicas = v > 1 ? 1 : static_cast<int64_t>(workers.size()) / k;
  // The worker of stage i of replica r.
  const auto worker_of = [&](int64_t i, int64_t r) -> WorkerRecord& {
    return v > 1 ? *workers[WorkerOfStage(schedule, k / v, i)]
                 : *workers[r * k + i];
  };
  // An interleaved schedule's assignments, one per worker, collecting its
  // chunks.
  std::vector<v1::ControllerMessage> chunked(v > 1 ? k / v : 0);
  // One key for the epoch's streams (services/security/stream_key.h);
  // never logged or stored: a restart of the controller bumps the epoch and
  // makes a new one.
  absl::StatusOr<std::string> stream_key = security::NewStreamKey();
  if (!stream_key.ok()) {
    const std::string message = std::string(stream_key.status().message());
    MarkTerminal(&job.status(), v1::FAILED, kFailed, "StreamKeyFailed", message,
                 now);
    jobs.Publish(job, message, now);
    return false;
  }
  const std::vector<int64_t> begins = StageBegins(balance);
  // ZB-V's order follows the stages' phase times: computed once here for
  // this cut and sent to every worker, so that all build the same order.
  // Shapes that do not infer (the spec was checked at submit) give none,
  // equal times, to every worker alike.
  std::vector<PhaseTicks> ticks;
  if (schedule == ScheduleKind::kZeroBubbleV) {
    if (absl::StatusOr<ModelShapes> shapes = InferModelShapes(spec.model());
        shapes.ok()) {
      ticks = CostModelTicks(*shapes, balance,
                             RematFromSpec(spec.pipeline().remat()));
    }
  }
  // Each worker's bubble for this cut, by the cost model: its metrics
  // read their measure against it (a cut of unequal stages idles the
  // lighter ones by design, which the alert on the theory alone took for
  // a fault).
  const std::vector<double> predicted = CutBubbles(
      spec, schedule, RematFromSpec(spec.pipeline().remat()), balance,
      MicroBatchCount(spec) / replicas, v, spec.batch_size() / replicas);
  const auto set_predicted = [&](v1::Assignment& a, int64_t w) {
    if (w < static_cast<int64_t>(predicted.size()))
      a.set_predicted_bubble(predicted[w]);
  };
  v1::JobStatus& status = job.status();
  const int64_t epoch = status.epoch() + 1;
  // Checked off the lock before this start (ScheduleJobs); used up now.
  // A resume from the replicas' memory (replica_resume.h) needs none.
  const std::optional<MemoryResume> memory = std::move(job.memory_resume);
  job.memory_resume.reset();
  const std::optional<v1::CheckpointRef> restore =
      memory ? std::nullopt : job.restore_point;
  job.restore_point.reset();
  job.restore_check = JobRecord::RestoreCheck::kNeeded;
  const int64_t start_step = memory    ? memory->step
                             : restore ? restore->step()
                                       : InitialStep(job.job.spec());
  status.set_epoch(epoch);
  status.set_step(start_step);
  status.set_running_stages(k);
  status.set_running_replicas(replicas);
  status.clear_stages();
  status.clear_replica_stages();
  status.clear_cut_bubbles();
  job.replicas = replicas;
  job.start_step = start_step;
  job.stage_steps.assign(k * replicas, start_step);
  job.stage_reported.assign(k * replicas, now);
  job.finished.assign(k * replicas, false);
  job.finished_paths.assign(k, "");
  job.evaluation_error.clear();
  job.evaluation_error_here = false;
  job.micro_batch_losses.clear();
  job.step_figures.clear();
  job.timed_reports.assign(k, 0);
  job.stage_costs.assign(k, std::nullopt);
  job.proposed_balance.clear();
  job.proposed_workers.clear();
  job.proposed_reason.clear();
  job.step_seconds = 0;
  job.step_reports = 0;
  job.checkpointing.clear();
  job.merging = false;
  job.stream_key = *stream_key;
  const std::string job_dir =
      storage::JobCheckpointDir(checkpoint_dir, job.id());
  const std::string output_dir = storage::FinalParametersDir(job_dir);
  std::string placed;
  std::vector<std::string> ids;
  for (const auto& w : workers) ids.push_back(w->id());
  job.tried_cuts.insert(CutKey(balance, ids));
  for (int64_t slot = 0; slot < k * replicas; ++slot) {
    const int64_t i = slot % k, r = slot / k;
    WorkerRecord& worker = worker_of(i, r);
    v1::StageStatus* stage =
        r == 0 ? status.add_stages() : status.add_replica_stages();
    stage->set_stage(i);
    stage->set_replica(r);
    stage->set_worker_id(worker.id());
    stage->set_address(worker.info.address());
    stage->set_layer_begin(begins[i]);
    stage->set_layer_end(begins[i] + balance[i]);

    v1::ControllerMessage message;
    v1::Assignment& a = *message.mutable_assignment();
    a.set_job_id(job.id());
    a.set_epoch(epoch);
    *a.mutable_spec() = spec;
    a.set_stage(i);
    a.set_stages(k);
    a.set_layer_begin(stage->layer_begin());
    a.set_layer_end(stage->layer_end());
    a.set_micro_batches(MicroBatchCount(spec));
    a.set_schedule(
        ScheduleToSpec(ScheduleFromSpec(spec.pipeline().schedule())));
    a.set_remat(RematToSpec(RematFromSpec(spec.pipeline().remat())));
    a.set_upstream_address(i > 0 ? worker_of(i - 1, r).info.address() : "");
    a.set_downstream_address(i + 1 < k ? worker_of(i + 1, r).info.address()
                                       : "");
    if (replicas > 1) {
      a.set_replica(r);
      a.set_replicas(replicas);
      for (int64_t q = 0; q < replicas; ++q)
        a.add_replica_addresses(worker_of(i, q).info.address());
    }
    a.set_start_step(start_step);
    a.set_resume_in_memory(memory.has_value());
    if (memory && memory->roll_forward_squares) {
      a.set_resume_roll_forward(true);
      a.set_resume_roll_forward_squares(*memory->roll_forward_squares);
    }
    a.set_checkpoint_transport(transport);
    // Through the controller, a stage gets no path: nothing it could write
    // or read there would be the controller's.
    if (transport == v1::CHECKPOINT_TRANSPORT_CONTROLLER) {
      if (restore) a.set_restore_step(restore->step());
    } else {
      a.set_output_dir(output_dir);
      a.set_checkpoint_dir(job_dir);
      if (restore) {
        a.set_restore_manifest(restore->manifest_path());
        a.set_restore_step(restore->step());
      }
    }
    a.set_stream_key(*stream_key);
    if (v == 1) set_predicted(a, i);
    absl::StrAppend(&placed, slot > 0 ? ", " : "", "stage ", i,
                    replicas > 1 ? absl::StrCat(" of replica ", r) : "",
                    " (layers ", stage->layer_begin(), "..",
                    stage->layer_end() - 1, ") on ", worker.id());
    if (v > 1) {
      // The worker's assignment is its chunk 0's (the chunks come in stage
      // order, so chunk 0 first), carrying every chunk (each without the
      // spec it shares).
      v1::ControllerMessage& whole = chunked[WorkerOfStage(schedule, k / v, i)];
      if (i < k / v) {
        whole = message;
      } else {
        a.clear_spec();
      }
      *whole.mutable_assignment()->add_chunks() = std::move(a);
      continue;
    }
    WorkerRegistry::Send(worker, std::move(message));
    WorkerRegistry::MarkBusy(worker, job.id(), i, r);
  }
  for (size_t w = 0; w < chunked.size(); ++w) {
    v1::Assignment& a = *chunked[w].mutable_assignment();
    a.mutable_chunks(0)->clear_spec();
    set_predicted(a, static_cast<int64_t>(w));
    for (const PhaseTicks& t : ticks) {
      a.add_phase_ticks(t.forward);
      a.add_phase_ticks(t.input);
      a.add_phase_ticks(t.weight);
    }
    WorkerRegistry::Send(*workers[w], std::move(chunked[w]));
    WorkerRegistry::MarkBusy(*workers[w], job.id(), static_cast<int64_t>(w));
  }
  status.set_state(v1::RUNNING);
  // The run's first start: its time and rate count from here, and from the
  // step it starts at (a fresh job continuing an init_from checkpoint's
  // step counted the steps before it as its own).
  if (!status.has_started()) {
    *status.mutable_started() = ToTimestamp(now);
    status.set_run_from_step(start_step);
  }
  SetCondition(&status, kScheduled, true, "StagesAssigned", placed, now);
  std::string running = absl::StrCat(
      StagesText(k, v),
      replicas > 1 ? absl::StrCat(" x ", replicas, " replicas") : "",
      ", epoch ", epoch, ": ", placed);
  if (k / v != job.stages) {
    absl::StrAppend(&running, " (elastic: ", k / v, " of ", job.stages,
                    v > 1 ? " workers" : "", ")");
  }
  if (const int64_t r = ReplicaCount(job.job.spec()); replicas < r) {
    absl::StrAppend(&running, " (elastic: ", replicas, " of ", r,
                    " replicas; more as workers join)");
  }
  if (restore) {
    absl::StrAppend(&running, "; restored the checkpoint of step ", start_step);
  }
  if (memory) {
    absl::StrAppend(&running, "; resumed step ", start_step,
                    " from the replicas' memory");
  }
  SetCondition(&status, kRunning, true, "Started", running, now);
  jobs.Publish(job, running, now);
  return true;
}

// The balancer's newest cut and workers when they are for k stages.
const v1::Repartition* RepartitionFor(const JobRecord& job, int64_t k) {
  const auto& all = job.status().repartitions();
  if (all.empty() || all.rbegin()->new_balance_size() != k) return nullptr;
  return &*all.rbegin();
}

// The workers the balancer chose for the stages, when all are free and
// hold their stages: indices into `idle` in stage order.
std::optional<std::vector<size_t>> ChosenWorkers(
    const v1::Repartition& r, const StagePlan& plan,
    const std::vector<std::shared_ptr<WorkerRecord>>& idle) {
  std::vector<size_t> place;
  std::vector<int64_t> memory;
  for (const std::string& id : r.workers()) {
    auto it = std::find_if(idle.begin(), idle.end(),
                           [&id](const auto& w) { return w->id() == id; });
    if (it == idle.end()) return std::nullopt;
    place.push_back(static_cast<size_t>(it - idle.begin()));
    memory.push_back((*it)->info.resources().memory_bytes());
  }
  if (!StagesFit(plan, memory)) return std::nullopt;
  return place;
}

// Starts `job` from its memory resume plan on `idle` (which loses the
// workers it takes): the plan's holders as replica 0, as many replicas as
// the free workers allow. False when it cannot start now: `why` then says
// what it waits for, or is empty when the plan is void (a holder is no
// longer free) and the job must restore its checkpoint instead.
bool StartFromMemory(JobTable& jobs, JobRecord& job,
                     std::vector<std::shared_ptr<WorkerRecord>>& idle,
                     const std::string& checkpoint_dir,
                     v1::CheckpointTransport transport, absl::Time now,
                     std::string* why) {
  const MemoryResume& plan = *job.memory_resume;
  const int64_t k = static_cast<int64_t>(plan.cut.size());
  std::vector<std::shared_ptr<WorkerRecord>> chosen;
  for (const std::string& id : plan.holders) {
    auto it = std::find_if(idle.begin(), idle.end(),
                           [&id](const auto& w) { return w->id() == id; });
    if (it == idle.end()) {
      LogInfo(
          "job %s: worker %s, which holds a stage's state, is not free; "
          "restoring the checkpoint instead",
          job.id(), id);
      job.memory_resume.reset();
      return false;
    }
    chosen.push_back(*it);
  }
  const v1::JobSpec& spec = job.job.spec();
  const int64_t replicas =
      ElasticReplicas(spec, k, static_cast<int64_t>(idle.size()));
  if (replicas == 0) {
    *why =
        WaitingMessage(k, MinReplicas(spec), static_cast<int64_t>(idle.size()));
    absl::StrAppend(
        why, SplitsBackward(ScheduleFromSpec(spec.pipeline().schedule()))
                 ? " (ZERO_BUBBLE_H1 runs one gradient group on each of its "
                   "replicas: all of them, or none)"
                 : " (pipeline.min_replicas)");
    return false;
  }
  std::vector<int64_t> balance;
  for (const auto& [begin, end] : plan.cut) balance.push_back(end - begin);
  // The other replicas where their stages fit, as a fresh start places
  // them.
  std::vector<std::shared_ptr<WorkerRecord>> others;
  for (const auto& w : idle) {
    if (std::find(chosen.begin(), chosen.end(), w) == chosen.end())
      others.push_back(w);
  }
  absl::StatusOr<StagePlan> stages = PlanStages(spec, k, balance);
  if (!stages.ok()) {
    job.memory_resume.reset();
    return false;
  }
  std::optional<std::vector<size_t>> place =
      PlaceStages(RepeatPlan(*stages, replicas - 1), WorkerMemory(others), why);
  if (!place) return false;
  for (size_t w : *place) chosen.push_back(others[w]);
  if (!Start(jobs, job, chosen, balance, checkpoint_dir, transport, now)) {
    return true;  // failed, as Start says; nothing more to do here
  }
  std::erase_if(idle, [&chosen](const auto& w) {
    return std::find(chosen.begin(), chosen.end(), w) != chosen.end();
  });
  return true;
}

}  // namespace

std::string StagesText(int64_t k, int64_t v) {
  if (v > 1 && k % v == 0) {
    return absl::StrCat(k / v, k / v == 1 ? " stage" : " stages", " x ", v,
                        " chunks");
  }
  return absl::StrCat(k, k == 1 ? " stage" : " stages");
}

std::string WaitingMessage(int64_t stages, int64_t replicas, int64_t free) {
  const int64_t needed = stages * replicas;
  return absl::StrCat(
      "needs ", needed, needed == 1 ? " worker, " : " workers, ", free, " free",
      replicas > 1
          ? absl::StrCat(" (", stages, " stages x ", replicas, " replicas)")
          : "");
}

absl::Duration ElasticGrace(const v1::JobSpec& spec) {
  const int64_t ms = spec.pipeline().elastic_grace_ms();
  return ms > 0 ? absl::Milliseconds(ms) : absl::Seconds(10);
}

int64_t MinStages(const v1::JobSpec& spec) {
  const int64_t k = StageCount(spec);
  const int64_t min = spec.pipeline().min_stages();
  return min > 0 ? std::min(min, k) : k;
}

namespace {

// The attached workers, busy or not, that could run a job of v chunks a
// stage (those that say they run chunks, and ZB-V's, where it has them).
int64_t AttachedFor(const std::vector<std::shared_ptr<WorkerRecord>>& all,
                    int64_t v, bool v_shape) {
  if (v <= 1) return static_cast<int64_t>(all.size());
  return std::count_if(all.begin(), all.end(), [&](const auto& w) {
    return w->runs_chunks && (!v_shape || w->runs_zero_bubble_v);
  });
}

}  // namespace

int64_t LeastWorkers(const v1::JobSpec& spec) {
  const int64_t replicas = ReplicaCount(spec);
  const int64_t min_replicas = spec.pipeline().min_replicas();
  return MinStages(spec) * (replicas > 1 && min_replicas > 0
                                ? std::min(min_replicas, replicas)
                                : replicas);
}

void ScheduleJobs(JobTable& jobs, WorkerRegistry& workers,
                  const std::string& checkpoint_dir,
                  v1::CheckpointTransport transport, absl::Time now,
                  const std::function<void(JobRecord&)>& check_restore_point) {
  std::vector<std::shared_ptr<WorkerRecord>> idle = workers.Free(now);
  const std::vector<std::shared_ptr<WorkerRecord>> all = workers.All();
  const JobRecord* blocked_by = nullptr;
  for (JobRecord* job : jobs.Waiting()) {
    if (now < job->not_before) {
      if (blocked_by == nullptr) blocked_by = job;  // FIFO: it goes first
      continue;
    }
    if (job->memory_resume && blocked_by == nullptr) {
      std::string waiting;
      if (StartFromMemory(jobs, *job, idle, checkpoint_dir, transport, now,
                          &waiting)) {
        continue;
      }
      if (!waiting.empty()) {
        blocked_by = job;
        const v1::Condition* scheduled =
            FindCondition(job->status(), kScheduled);
        if (scheduled == nullptr || scheduled->message() != waiting) {
          SetCondition(&job->status(), kScheduled, false, kWaitingForWorkers,
                       waiting, now);
          jobs.Publish(*job, waiting, now);
        }
        continue;
      }
    }
    // With chunks, the workers that say they run them (an older one would
    // run chunk 0 as a stage of its own), and under ZB-V place them in a V.
    const int64_t v = VirtualStageCount(job->job.spec());
    const ScheduleKind schedule =
        ScheduleFromSpec(job->job.spec().pipeline().schedule());
    const bool v_shape = schedule == ScheduleKind::kZeroBubbleV;
    std::vector<std::shared_ptr<WorkerRecord>> able;
    if (v > 1) {
      for (const auto& w : idle)
        if (w->runs_chunks && (!v_shape || w->runs_zero_bubble_v))
          able.push_back(w);
    }
    const std::vector<std::shared_ptr<WorkerRecord>>& pool =
        v > 1 ? able : idle;
    const int64_t free = static_cast<int64_t>(pool.size());
    int64_t k = job->stages;
    // Replicas take K x R workers, all or none (a gang); a job that ran
    // before, or one that sets pipeline.min_replicas and has been short of
    // workers for longer than its grace period, goes on with fewer (down to
    // min_replicas) and grows back as workers join, its bits the same.
    int64_t replicas = ReplicaCount(job->job.spec());
    if (replicas > 1 &&
        (job->status().epoch() > 0 ||
         (blocked_by == nullptr &&
          job->job.spec().pipeline().min_replicas() > 0 &&
          now - job->waiting_since >= ElasticGrace(job->job.spec())))) {
      const int64_t fit = ElasticReplicas(job->job.spec(), k, free);
      if (fit > 0) replicas = fit;
    }
    // Short of workers for longer than the grace period: run on what there
    // is. Exact all the same: stages change only at checkpoint boundaries.
    // (Replicas wait for all their workers so far.)
    // A schedule with chunks runs on the most workers its shape takes (the
    // interleaved one's warm-up takes micro-batches K at a time, so K' must
    // divide M; ZB-V takes any), each with its v chunks: K' x v stages,
    // checkpoints restored by layer as always.
    if (blocked_by == nullptr && replicas == 1 && free < k &&
        free >= MinStages(job->job.spec()) &&
        now - job->waiting_since >= ElasticGrace(job->job.spec())) {
      int64_t fit = free;
      const int64_t m = MicroBatchCount(job->job.spec());
      while (v > 1 && fit > 0 &&
             !ScheduleShapeError(schedule, fit, m, v).empty())
        --fit;
      if (fit >= MinStages(job->job.spec())) k = fit;
    }
    if (blocked_by == nullptr && free >= k * replicas && k > 0 &&
        !job->status().checkpoints().empty() &&
        job->restore_check != JobRecord::RestoreCheck::kChecked) {
      // Its restore point is read and hashed off the lock first; it goes
      // first once that is done (the check reschedules).
      if (job->restore_check == JobRecord::RestoreCheck::kNeeded) {
        job->restore_check = JobRecord::RestoreCheck::kChecking;
        check_restore_point(*job);
      }
      blocked_by = job;
      continue;
    }
    std::string why;
    if (blocked_by == nullptr && free >= k * replicas && k > 0) {
      const v1::Repartition* rebalanced =
          replicas == 1 ? RepartitionFor(*job, k) : nullptr;
      absl::StatusOr<StagePlan> plan = PlanStages(
          job->job.spec(), k * v,
          rebalanced != nullptr
              ? std::vector<int64_t>(rebalanced->new_balance().begin(),
                                     rebalanced->new_balance().end())
              : std::vector<int64_t>());
      if (!plan.ok()) {
        const std::string message =
            absl::StrCat("cannot partition: ", plan.status().message());
        MarkTerminal(&job->status(), v1::FAILED, kFailed, "PartitionFailed",
                     message, now);
        jobs.Publish(*job, message, now);
        continue;
      }
      std::optional<std::vector<size_t>> place;
      if (rebalanced != nullptr)
        place = ChosenWorkers(*rebalanced, *plan, pool);
      if (!place) {
        place = PlaceStages(v > 1 ? WorkerPlan(*plan, schedule, k)
                                  : RepeatPlan(*plan, replicas),
                            WorkerMemory(pool), &why);
      }
      if (place) {
        std::vector<std::shared_ptr<WorkerRecord>> chosen;
        for (size_t w : *place) chosen.push_back(pool[w]);
        if (Start(jobs, *job, chosen, plan->balance, checkpoint_dir, transport,
                  now)) {
          std::erase_if(idle, [&chosen](const auto& w) {
            return std::find(chosen.begin(), chosen.end(), w) != chosen.end();
          });
        }
        continue;
      }
    }
    k = job->stages;
    // Enough workers but not enough memory on them says so; otherwise the
    // count.
    std::string message =
        !why.empty() ? why
                     : WaitingMessage(k, replicas, static_cast<int64_t>(free));
    if (why.empty() && v > 1 && able.size() < idle.size()) {
      const size_t older = idle.size() - able.size();
      absl::StrAppend(&message,
                      v_shape ? " that run ZB-V's chunks ("
                              : " that run an interleaved schedule's chunks (",
                      older,
                      older == 1 ? " other is an older worker"
                                 : " others are older workers",
                      older == 1 ? " that does not)" : " that do not)");
    }
    if (blocked_by != nullptr) {
      absl::StrAppend(&message, "; queued behind ", blocked_by->id());
    } else if (const int64_t attached = AttachedFor(all, v, v_shape);
               job->status().state() == v1::PENDING &&
               LeastWorkers(job->job.spec()) > attached) {
      // Strict FIFO holds the queue for a job waiting on workers that are
      // busy; a queued one that needs more than are attached (that could
      // run it) waits for more to join, and holding the queue for it left
      // every worker idle and every job behind it waiting, for good. It
      // still goes first once enough have joined. A job that was running
      // (RESTARTING) always holds it: its workers come back one by one
      // after a controller restart, and a lost one's replacement joins
      // later.
      absl::StrAppend(
          &message,
          attached == 0
              ? std::string(" (no worker is attached: it waits for some to "
                            "join; jobs behind it that fit go first)")
              : absl::StrCat(" (only ", attached,
                             attached == 1 ? " is attached" : " are attached",
                             ": it waits for more to join; jobs behind it "
                             "that fit go first)"));
    } else {
      blocked_by = job;
    }
    const v1::Condition* scheduled = FindCondition(job->status(), kScheduled);
    if (scheduled == nullptr || scheduled->message() != message) {
      SetCondition(&job->status(), kScheduled, false, kWaitingForWorkers,
                   message, now);
      jobs.Publish(*job, message, now);
    }
  }
}

}  // namespace gpipe::controller
