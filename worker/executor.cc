#include "worker/executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/core/bytes.h"
#include "services/core/log.h"
#include "services/core/memory.h"
#include "services/core/status.h"
#include "services/pipeline/gradient_tree.h"
#include "services/pipeline/init_weights.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/link_reduction.h"
#include "services/pipeline/memory_model.h"
#include "services/pipeline/micro_batch.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/stage.h"
#include "services/pipeline/step_plan.h"
#include "services/pipeline/worker_step.h"
#include "services/security/stream_key.h"
#include "services/telemetry/metered_link.h"
#include "services/telemetry/step_trace.h"
#include "services/tensor/threads.h"
#include "services/transport/in_process_link.h"
#include "services/transport/shm_segment.h"
#include "worker/grpc_downstream_connector.h"
#include "worker/memory_budget.h"

namespace gpipe {

struct Executor::Run {
  gpipe::v1::Assignment assignment;
  // The stages it runs: its chunks (each with the assignment's spec), or
  // the assignment alone.
  std::vector<gpipe::v1::Assignment> chunks;
  absl::Status chunks_status;  // ChunksOf's: the run fails with it
  bool cancelled = false;
  // The same, read without the lock by the stage's thread at each tensor
  // allocation (AllocationsCancelledBy): a cancel stops compute within one
  // layer op, not at the next send or receive.
  std::atomic<bool> stop{false};
  // Set by AcceptUpstream, by the stage that receives on them.
  std::map<int64_t, std::shared_ptr<Link>> upstreams;
  std::vector<Link*> downstreams;  // while connected, for Cancel
  // Replicas: the reduction links accepted from the replicas below this one
  // (by replica), and those dialled to the replicas above while connected
  // (for Cancel).
  std::map<int64_t, std::shared_ptr<Link>> replica_links;
  std::vector<Link*> dialed_replicas;
  // The host memory each link this worker dials may map (the shared
  // segment it creates): what the worker's memory for stages leaves once
  // its stages have what the memory model says they need, shared evenly.
  // The segment is charged to its creator, which pre-faults it (the kernel
  // charges a shared page to the cgroup that touches it first): a link
  // accepted from upstream costs this worker none. -1 before the run has
  // checked its memory.
  int64_t segment_room = -1;
  int64_t need = 0;  // CheckMemory's, set with segment_room
  // The stages' metrics once made (null without a metrics server), for
  // SetCutBubble; and the last bubble it gave, for metrics made after it.
  std::vector<std::shared_ptr<StageMetrics>> metrics;
  std::optional<double> cut_bubble;
};

namespace {

// Where the assignment puts the stage and how it runs.
StagePlacement PlacementOf(const gpipe::v1::Assignment& a, Device device,
                           double compute_slowdown) {
  StagePlacement p;
  p.index = a.stage();
  p.count = a.stages();
  p.layer_begin = a.layer_begin();
  p.layer_end = a.layer_end();
  p.micro_batches = a.micro_batches();
  p.schedule = ScheduleFromSpec(a.schedule());
  p.remat = RematFromSpec(a.remat());
  p.device = device;
  p.compute_slowdown = compute_slowdown;
  // The spec's tree over gradient groups is part of the numerics: every
  // replica count sums as the reference trainer does.
  p.gradient_groups = GradientGroupCount(a.spec());
  return p;
}

int64_t ReplicasOf(const gpipe::v1::Assignment& a) {
  return std::max<int64_t>(1, a.replicas());
}

// Whether the assignment's replicas can share its spec's gradient groups:
// INVALID_ARGUMENT naming what is wrong before anything is built on them.
absl::Status CheckReplicaAssignment(const gpipe::v1::Assignment& a) {
  const int64_t r = ReplicasOf(a);
  if (a.replicas() < 0 || r > kMaxReplicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment: replicas must be in [0, ", kMaxReplicas,
                     "], got ", a.replicas()));
  }
  if (a.replica() < 0 || a.replica() >= r) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment: replica ", a.replica(), " is not one of its ",
                     r, " replica", r > 1 ? "s" : ""));
  }
  if (r == 1) return absl::OkStatus();
  if (a.replica_addresses_size() != r) {
    return absl::InvalidArgumentError(absl::StrCat(
        "assignment: ", a.replica_addresses_size(), " replica addresses for ",
        r, " replicas of stage ", a.stage()));
  }
  // The spec as this assignment runs it: R replicas sharing the spec's own
  // groups (pinned, so that R may differ from the spec's without changing
  // a bit) of the assignment's micro-batches.
  gpipe::v1::JobSpec spec = a.spec();
  spec.mutable_pipeline()->set_gradient_groups(GradientGroupCount(a.spec()));
  spec.mutable_pipeline()->set_replicas(r);
  spec.mutable_pipeline()->set_micro_batches(a.micro_batches());
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment of ", r, " replicas: ", s.message()));
  }
  return absl::OkStatus();
}

// The phase times the controller computed for ZB-V's order (three numbers
// a stage); INVALID_ARGUMENT when they are not a set per stage in range.
absl::StatusOr<std::vector<PhaseTicks>> AssignedPhaseTicks(
    const gpipe::v1::Assignment& a) {
  std::vector<PhaseTicks> ticks;
  if (a.phase_ticks_size() % 3 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("assignment: ", a.phase_ticks_size(),
                     " phase_ticks, not three a stage"));
  }
  for (int i = 0; i + 2 < a.phase_ticks_size(); i += 3) {
    ticks.push_back(
        {a.phase_ticks(i), a.phase_ticks(i + 1), a.phase_ticks(i + 2)});
  }
  if (const std::string e = PhaseTicksError(ticks, a.stages()); !e.empty())
    return absl::InvalidArgumentError(absl::StrCat("assignment: ", e));
  return ticks;
}

// The stages an assignment runs: its chunks, each given the assignment's
// spec, or the assignment itself. INVALID_ARGUMENT naming what is wrong
// when the chunks are not the worker's stages of one job and epoch as its
// schedule places them (StageOfChunk).
absl::StatusOr<std::vector<gpipe::v1::Assignment>> ChunksOf(
    const gpipe::v1::Assignment& a) {
  if (a.chunks_size() == 0) return std::vector<gpipe::v1::Assignment>{a};
  const int64_t v = a.chunks_size();
  const int64_t k = a.stages() / v;
  if (v < 2 || a.stages() % v != 0 || a.stage() < 0 || a.stage() >= k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "assignment: ", v, " chunks of ", a.stages(),
        " stages do not place one worker's stages (worker ", a.stage(), ")"));
  }
  if (a.replicas() > 1) {
    return absl::InvalidArgumentError(
        "assignment: chunks with replicas (an interleaved schedule runs one "
        "pipeline)");
  }
  const ScheduleKind schedule = ScheduleFromSpec(a.schedule());
  if (const std::string shape =
          ScheduleShapeError(schedule, k, a.micro_batches(), v);
      !shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("assignment: ", shape));
  }
  RETURN_IF_ERROR(AssignedPhaseTicks(a).status());
  std::vector<gpipe::v1::Assignment> out;
  for (int64_t c = 0; c < v; ++c) {
    gpipe::v1::Assignment chunk = a.chunks(c);
    const int64_t stage = StageOfChunk(schedule, k, a.stage(), c);
    if (chunk.job_id() != a.job_id() || chunk.epoch() != a.epoch() ||
        chunk.stage() != stage || chunk.stages() != a.stages() ||
        chunk.chunks_size() > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "assignment: chunk ", c, " is stage ", chunk.stage(), " of ",
          chunk.stages(), " of ", chunk.job_id(), " epoch ", chunk.epoch(),
          "; worker ", a.stage(), "'s chunk ", c, " is stage ", stage, " of ",
          a.stages(), " of ", a.job_id(), " epoch ", a.epoch()));
    }
    *chunk.mutable_spec() = a.spec();
    *chunk.mutable_phase_ticks() = a.phase_ticks();
    out.push_back(std::move(chunk));
  }
  return out;
}

}  // namespace

struct Executor::Execution {
  Execution(std::shared_ptr<Run> r, const gpipe::v1::Assignment& chunk,
            Device device, double compute_slowdown)
      : run(std::move(r)),
        a(chunk),
        spec(a.spec()),
        plan(StepPlan::FromSpec(spec)),
        placement(PlacementOf(a, device, compute_slowdown)),
        first(a.stage() == 0),
        last(a.stage() == a.stages() - 1),
        replicas(ReplicasOf(a)),
        // Replicas hold the same parameters: one of them evaluates,
        // checkpoints and writes the final parameters.
        writes(a.replica() == 0) {}

  const std::shared_ptr<Run> run;
  const gpipe::v1::Assignment& a;
  const gpipe::v1::JobSpec& spec;
  const StepPlan plan;
  StagePlacement placement;  // the reducer is added once connected
  const bool first, last;
  const int64_t replicas;
  const bool writes;
  std::shared_ptr<StageMetrics> metrics;   // null without a metrics server
  std::shared_ptr<const Dataset> dataset;  // the first and last stage's
  std::unique_ptr<Link> downstream;
  std::shared_ptr<Link> upstream;
  std::unique_ptr<MeteredLink> metered_up, metered_down;
  std::string data_plane;         // of the link downstream, for progress
  std::string data_plane_reason;  // why not a faster one (AgreedPlane)
  // Replicas: the reduction links, dialled (to replicas above) and accepted
  // (from below), and the reduction over them.
  std::vector<std::unique_ptr<Link>> dialed_replicas;
  std::vector<std::shared_ptr<Link>> accepted_replicas;
  std::vector<Link*> replica_peers;  // [q]: to replica q, null for this one
  std::unique_ptr<LinkReduction> reduction;
  // The reduction's steps, seconds and bytes so far (metrics, the summary).
  int64_t reduced_steps = 0;
  double reduced_seconds = 0;
  int64_t reduced_bytes = 0;
  // Steps the stage's state has taken at its last step boundary (-1 before
  // it was restored): what Park keeps.
  int64_t done_steps = -1;
  std::unique_ptr<Stage> stage;
};

Executor::Executor(int threads, Reporter report, PipelineMetrics* metrics,
                   Device device)
    : threads_(threads),
      report_(std::move(report)),
      metrics_(metrics),
      device_(device) {
  reaper_ = std::thread([this] { ReapParked(); });
}

Executor::~Executor() {
  CancelAll();
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    cv_.notify_all();
  }
  reaper_.join();
}

bool Executor::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_ != nullptr;
}

void Executor::StopLocked(std::unique_lock<std::mutex>& lock) {
  if (current_ != nullptr) {
    current_->cancelled = true;
    current_->stop.store(true);
    for (auto& [stage, link] : current_->upstreams) link->Close();
    for (Link* link : current_->downstreams) link->Close();
    for (auto& [replica, link] : current_->replica_links) link->Close();
    for (Link* link : current_->dialed_replicas) link->Close();
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    std::thread t = std::move(thread_);
    lock.unlock();
    t.join();
    lock.lock();
  }
}

int64_t Executor::parked_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return parked_ != nullptr ? parked_->step : -1;
}

void Executor::SetParked(std::unique_ptr<ParkedStage> p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    parked_.swap(p);
    if (parked_ != nullptr) {
      parked_until_ = std::chrono::steady_clock::now() + parked_ttl_;
      cv_.notify_all();
    }
  }
  // The old state's tensors are freed here, outside the lock.
}

void Executor::ReapParked() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutting_down_) {
    if (parked_ == nullptr || current_ != nullptr) {
      cv_.wait(lock);
      continue;
    }
    if (std::chrono::steady_clock::now() < parked_until_) {
      cv_.wait_until(lock, parked_until_);
      continue;
    }
    std::unique_ptr<ParkedStage> expired = std::move(parked_);
    lock.unlock();
    LogInfo(
        "freed the state of %s's layers [%d, %d) after step %d: kept %.1f s "
        "for a resume from memory, not used",
        expired->job_id, expired->layer_begin, expired->layer_end,
        expired->step, std::chrono::duration<double>(parked_ttl_).count());
    expired.reset();
    ReleaseFreedMemory();
    lock.lock();
  }
}

void Executor::Start(const gpipe::v1::Assignment& a) {
  std::unique_lock<std::mutex> lock(mu_);
  StopLocked(lock);
  if (connector_ == nullptr) {
    connector_ = std::make_unique<GrpcDownstreamConnector>(
        exchange_credentials_, data_plane_);
  }
  auto run = std::make_shared<Run>();
  run->assignment = a;
  absl::StatusOr<std::vector<gpipe::v1::Assignment>> chunks = ChunksOf(a);
  if (chunks.ok()) {
    run->chunks = *std::move(chunks);
  } else {
    run->chunks = {a};
    run->chunks.front().clear_chunks();
    run->chunks_status = chunks.status();
  }
  current_ = run;
  cv_.notify_all();
  thread_ = std::thread([this, run] {
    Execute(run);
    // The stage's tensors are freed; KeepFreedMemory would keep them in
    // the heap, and a cancelled large stage must give its memory back.
    ReleaseFreedMemory();
  });
}

void Executor::Cancel(const std::string& job_id, int64_t epoch) {
  std::unique_lock<std::mutex> lock(mu_);
  if (current_ == nullptr || current_->assignment.job_id() != job_id ||
      current_->assignment.epoch() != epoch) {
    return;
  }
  LogInfo("cancelling stage %d of %s (epoch %d)", current_->assignment.stage(),
          job_id, epoch);
  StopLocked(lock);
}

void Executor::SetCutBubble(const std::string& job_id, int64_t epoch,
                            double bubble) {
  std::lock_guard<std::mutex> lock(mu_);
  if (current_ == nullptr || current_->assignment.job_id() != job_id ||
      current_->assignment.epoch() != epoch || !std::isfinite(bubble)) {
    return;
  }
  current_->cut_bubble = std::clamp(bubble, 0.0, 1.0);
  for (const std::shared_ptr<StageMetrics>& m : current_->metrics)
    m->SetPredictedBubble(*current_->cut_bubble);
}

void Executor::CancelAll() {
  std::unique_lock<std::mutex> lock(mu_);
  StopLocked(lock);
}

absl::Status Executor::AcceptUpstream(const std::string& job_id, int64_t epoch,
                                      int64_t from_stage, int64_t from_replica,
                                      std::shared_ptr<Link> link,
                                      int64_t wait_ms,
                                      const std::optional<std::string>& key) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  for (;;) {
    if (current_ != nullptr && !current_->cancelled) {
      const gpipe::v1::Assignment& a = current_->assignment;
      if (a.job_id() == job_id && epoch < a.epoch()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "link of job ", job_id, " epoch ", epoch,
            " is older than this worker's epoch ", a.epoch(), ": rejected"));
      }
      if (a.job_id() == job_id && a.epoch() == epoch) {
        if (key.has_value()) {
          RETURN_IF_ERROR(security::CheckStreamKey(a.stream_key(), *key));
        }
        if (from_stage == a.stage() && a.replicas() > 1) {
          return AcceptReplicaLocked(from_replica, std::move(link));
        }
        // The stage of this worker that receives from `from_stage`.
        const std::vector<gpipe::v1::Assignment>& chunks = current_->chunks;
        const auto to = std::find_if(
            chunks.begin(), chunks.end(),
            [&](const auto& c) { return c.stage() == from_stage + 1; });
        if (to == chunks.end()) {
          std::string mine;
          for (const auto& c : chunks)
            absl::StrAppend(&mine, mine.empty() ? "" : ", ", c.stage());
          return absl::FailedPreconditionError(absl::StrCat(
              "link from stage ", from_stage, " but this worker ", "runs stage",
              chunks.size() > 1 ? "s " : " ", mine, " of job ", job_id));
        }
        if (from_replica != a.replica()) {
          return absl::FailedPreconditionError(
              absl::StrCat("link from stage ", from_stage, " of replica ",
                           from_replica, " but this worker runs replica ",
                           a.replica(), " of job ", job_id));
        }
        if (current_->upstreams.contains(to->stage())) {
          return absl::AlreadyExistsError(
              absl::StrCat("stage ", to->stage(), " of job ", job_id, " epoch ",
                           epoch, " already has its upstream link"));
        }
        current_->upstreams[to->stage()] = std::move(link);
        cv_.notify_all();
        return absl::OkStatus();
      }
    }
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return absl::FailedPreconditionError(
          absl::StrCat("this worker has no assignment for job ", job_id,
                       " epoch ", epoch, ": link rejected"));
    }
  }
}

absl::Status Executor::AcceptReplicaLocked(int64_t from_replica,
                                           std::shared_ptr<Link> link) {
  const gpipe::v1::Assignment& a = current_->assignment;
  // Each replica dials the replicas above it, so only lower ones call.
  if (from_replica < 0 || from_replica >= a.replica()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "reduction link from replica ", from_replica, " of stage ", a.stage(),
        " but this worker runs replica ", a.replica(), " of ", a.replicas(),
        " and only the replicas below it dial it, job ", a.job_id()));
  }
  if (!current_->replica_links.emplace(from_replica, std::move(link)).second) {
    return absl::AlreadyExistsError(absl::StrCat(
        "replica ", a.replica(), " of stage ", a.stage(), " of job ",
        a.job_id(), " already has its link from replica ", from_replica));
  }
  cv_.notify_all();
  return absl::OkStatus();
}

namespace {

constexpr absl::string_view kCheckpointErrorPrefix = "checkpoint: ";
// No replica of the stage held the state to resume from: the controller
// falls back to the checkpoint.
constexpr absl::string_view kResumeErrorPrefix = "resume: ";
gpipe::v1::WorkerMessage Failure(const gpipe::v1::Assignment& a,
                                 const absl::Status& status) {
  gpipe::v1::WorkerMessage m;
  auto* f = m.mutable_failed();
  f->set_job_id(a.job_id());
  f->set_epoch(a.epoch());
  f->set_stage(a.stage());
  f->set_replica(a.replica());
  f->set_message(std::string(status.message()));
  // Neither a loss that is not finite, bad data nor what this worker does
  // not implement (batch norm with replicas on a GPU) gets better by
  // retrying; a lost neighbour or link does.
  // A checkpoint that cannot be written or restored is retried too: the
  // controller then falls back to the previous committed checkpoint.
  const bool loss = absl::StrContains(status.message(), "loss is not finite");
  const bool checkpoint =
      absl::StartsWith(status.message(), kCheckpointErrorPrefix);
  const bool memory = IsMemoryError(status);
  const bool resume = absl::StartsWith(status.message(), kResumeErrorPrefix);
  const bool data = !checkpoint && !memory && !resume &&
                    (absl::IsInvalidArgument(status) ||
                     absl::IsNotFound(status) || absl::IsDataLoss(status));
  const bool unsupported =
      !checkpoint && !resume && absl::IsUnimplemented(status);
  f->set_permanent(loss || data || memory || unsupported);
  // A full checkpoint store (the controller's disk, or the shared volume)
  // is a condition to wait out, which the controller does without counting
  // a restart.
  const bool store_full = checkpoint && absl::IsResourceExhausted(status);
  f->set_reason(loss          ? "LossNotFinite"
                : memory      ? "OutOfMemory"
                : store_full  ? "CheckpointStoreFull"
                : checkpoint  ? "CheckpointFailed"
                : resume      ? "ResumeFailed"
                : data        ? "InvalidData"
                : unsupported ? "Unsupported"
                              : "LinkFailed");
  return m;
}

// Marks a status as a checkpoint's, keeping its code.
absl::Status CheckpointError(const absl::Status& s) {
  return absl::Status(s.code(),
                      absl::StrCat(kCheckpointErrorPrefix, s.message()));
}

gpipe::v1::Evaluation ToEvaluation(int64_t step, const LossResult& e) {
  gpipe::v1::Evaluation out;
  out.set_loss(e.loss_sum / e.counted);
  out.set_accuracy(static_cast<double>(e.correct) / e.counted);
  out.set_counted(e.counted);
  out.set_step(step);
  return out;
}

gpipe::v1::WorkerMessage Evaluated(const gpipe::v1::Assignment& a, int64_t step,
                                   const LossResult& e) {
  gpipe::v1::WorkerMessage m;
  auto* r = m.mutable_evaluated();
  r->set_job_id(a.job_id());
  r->set_epoch(a.epoch());
  r->set_stage(a.stage());
  *r->mutable_evaluation() = ToEvaluation(step, e);
  return m;
}

// The samples of a step this stage runs: the whole batch, or with replicas
// this replica's micro-batches' rows, so the replicas' counts add up to it.
int64_t ReplicaSamples(const StagePlacement& p, int64_t batch_size) {
  if (p.micro_batches < 1 || p.micro_batches > batch_size) return batch_size;
  const std::vector<RowRange> ranges =
      SplitMicroBatches(batch_size, p.micro_batches);
  const int64_t end =
      std::min<int64_t>(p.local_end(), static_cast<int64_t>(ranges.size()));
  int64_t rows = 0;
  for (int64_t m = std::max<int64_t>(0, p.micro_batch_begin); m < end; ++m)
    rows += ranges[m].end - ranges[m].begin;
  return rows;
}

}  // namespace

bool Executor::cancelled(const Run& run) const {
  std::lock_guard<std::mutex> lock(mu_);
  return run.cancelled;
}

void Executor::Execute(std::shared_ptr<Run> run) {
  SetComputeThreads(threads_);
  const int64_t heap_releases = HeapReleases();
  // One execution per stage the assignment runs (its chunks); the first
  // speaks for the assignment (failures, replicas, a parked state).
  std::vector<std::unique_ptr<Execution>> xs;
  for (const gpipe::v1::Assignment& chunk : run->chunks) {
    xs.push_back(
        std::make_unique<Execution>(run, chunk, device_, compute_slowdown_));
  }
  Execution& x = *xs.front();
  const gpipe::v1::Assignment& a = x.a;
  // Another job's state, or one this assignment will not resume from
  // (another cut's layers cannot be its stage's).
  if (parked_ != nullptr &&
      (parked_->job_id != a.job_id() || !a.resume_in_memory() ||
       parked_->layer_begin != a.layer_begin() ||
       parked_->layer_end != a.layer_end() || xs.size() > 1)) {
    SetParked(nullptr);
  }
  if (metrics_ != nullptr && !xs.empty()) {
    std::vector<std::pair<int64_t, int64_t>> kept;
    for (const auto& c : xs) kept.emplace_back(c->a.stage(), c->a.replica());
    metrics_->KeepOnly(xs.front()->a.job_id(), kept);
  }
  for (const auto& c : xs) {
    LogInfo("running stage %d/%d of %s (epoch %d): layers [%d, %d), M=%d%s",
            c->a.stage(), c->a.stages(), c->a.job_id(), c->a.epoch(),
            c->a.layer_begin(), c->a.layer_end(), c->a.micro_batches(),
            xs.size() > 1 ? absl::StrCat(", chunk ", &c - &xs.front(), " of ",
                                         xs.size(), " on this worker")
                          : std::string());
    if (metrics_ != nullptr) {
      // Each of R replicas runs M / R of the step's micro-batches: its
      // bubble in theory is that pipeline's (it read M's: 20% for K=2,
      // M=4, R=2, against the 33% the progress line says).
      c->metrics = metrics_->ForStage(
          c->a.job_id(), c->a.stage(), c->a.replica(), c->a.stages(),
          c->a.micro_batches() / std::max<int64_t>(1, c->a.replicas()), c->last,
          ScheduleFromSpec(c->a.schedule()), static_cast<int64_t>(xs.size()));
      c->metrics->StartAt(a.start_step());
      // A worker's chunks share its predicted bubble, as their measured
      // one is the worker's.
      std::lock_guard<std::mutex> lock(mu_);
      if (run->cut_bubble) {
        c->metrics->SetPredictedBubble(*run->cut_bubble);
      } else if (a.has_predicted_bubble()) {
        c->metrics->SetPredictedBubble(a.predicted_bubble());
      }
      run->metrics.push_back(c->metrics);
    }
  }
  const auto run_stage = [&]() -> absl::Status {
    RETURN_IF_ERROR(run->chunks_status);
    RETURN_IF_ERROR(CheckReplicaAssignment(a));
    ASSIGN_OR_RETURN(run->need, CheckMemory(xs));
    // Read by this thread only (ConnectDownstream, ConnectReplicas).
    run->segment_room = SegmentRoom(xs, run->need);
    std::shared_ptr<const Dataset> dataset;
    for (const auto& c : xs) {
      if (!c->first && !c->last) continue;
      if (dataset == nullptr) {
        ASSIGN_OR_RETURN(std::unique_ptr<Dataset> d, OpenJobDataset(x.spec));
        dataset = std::move(d);
      }
      c->dataset = dataset;
    }
    RETURN_IF_ERROR(LinkOwnChunks(*run, xs));
    // Every link down before any up: a worker's chunks wait for workers
    // that wait for theirs, around the ring of an interleaved pipeline.
    for (const auto& c : xs)
      if (!c->last && c->downstream == nullptr)
        RETURN_IF_ERROR(ConnectDownstream(*c));
    for (const auto& c : xs)
      if (!c->first) RETURN_IF_ERROR(AwaitUpstream(*c));
    RETURN_IF_ERROR(ConnectReplicas(x));
    // The segments it created hold memory beside its tensors.
    const int64_t tensor_limit = TensorLimit(xs);
    if (tensor_limit > 0 && tensor_limit < memory_budget_) {
      LogInfo(
          "stage %d of %s: the segments its links created hold %s of "
          "shared memory; its tensors may hold %s",
          a.stage(), a.job_id(), FormatBytes(memory_budget_ - tensor_limit),
          FormatBytes(tensor_limit));
    }
    TensorMemoryLimit beside_segments(tensor_limit);
    for (const auto& c : xs) RETURN_IF_ERROR(BuildStage(*c));
    for (const auto& c : xs) RETURN_IF_ERROR(Restore(*c));
    for (const auto& c : xs) c->done_steps = a.start_step();
    RETURN_IF_ERROR(RunSteps(xs));
    return Finish(xs);
  };
  absl::Status status;
  try {
    // Host tensors past the budget throw (TensorMemoryExhausted): the stage
    // unwinds and fails instead of the kernel killing the worker.
    TensorMemoryLimit limit(HostBudget());
    AllocationsCancelledBy stop(&run->stop);
    status = run_stage();
  } catch (const std::bad_alloc& e) {
    status = MemoryError(e.what());
  } catch (const AllocationCancelled&) {
    status = absl::CancelledError("cancelled while computing");
  }

  if (!status.ok()) {
    // The report goes out before the links close: a neighbour that finds
    // its link closed reports a lost link, which the controller restarts
    // the job for, and a permanent failure (a loss that is not finite, bad
    // data) arriving after that restart was ignored as of an old epoch, so
    // the job replayed into the same failure several times.
    if (!cancelled(*run)) {
      LogWarning("stage %d of %s failed: %s", a.stage(), a.job_id(),
                 std::string(status.message()));
      report_(Failure(a, status));
    }
    ClosePipelineLinks(xs);
    for (auto& link : x.dialed_replicas) link->Close();
    for (auto& link : x.accepted_replicas) link->Close();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    run->downstreams.clear();
    run->dialed_replicas.clear();
    // No more links for this run; those accepted but not yet taken (the run
    // ended while connecting) are released below like the others, or their
    // Exchange handlers would wait for ever.
    run->cancelled = true;
    for (auto& [q, link] : run->replica_links) {
      if (std::find(x.accepted_replicas.begin(), x.accepted_replicas.end(),
                    link) == x.accepted_replicas.end()) {
        link->Close();
        x.accepted_replicas.push_back(link);
      }
    }
    run->replica_links.clear();
    for (const auto& c : xs) {
      auto it = run->upstreams.find(c->a.stage());
      if (c->upstream == nullptr && it != run->upstreams.end()) {
        it->second->Close();
        c->upstream = it->second;
      }
    }
  }
  if (status.ok()) {
    SetParked(nullptr);
  } else {
    Park(x);
  }
  for (const auto& c : xs) {
    c->stage.reset();  // before the links it uses
    c->reduction.reset();
    c->metered_down.reset();
    c->metered_up.reset();
  }
  // The links accepted from lower replicas first: each replica waits only
  // for those above it, so the highest lets go first and no wait closes a
  // cycle.
  for (auto& link : x.accepted_replicas) link->Release();
  x.dialed_replicas.clear();  // half-close, wait for the replicas above
  // Every upstream let go before waiting on any downstream: around an
  // interleaved pipeline's ring, a worker waiting for its next one while
  // holding its previous one's link would close a cycle.
  for (const auto& c : xs)
    if (c->upstream) c->upstream->Release();
  // Half-closes and waits for the next stage.
  for (const auto& c : xs) c->downstream.reset();
  // The stages and their metered links are gone: nothing observes any more,
  // and a CutBubble from now on must not bring a finished series back.
  {
    std::lock_guard<std::mutex> lock(mu_);
    run->metrics.clear();
  }
  for (const auto& c : xs) {
    if (c->metrics != nullptr)
      metrics_->Finish(c->a.job_id(), c->a.stage(), c->a.replica(),
                       /*completed=*/status.ok());
  }
  if (const int64_t n = HeapReleases() - heap_releases; n > 0) {
    LogInfo(
        "stage %d of %s: the heap handed its free memory back %s before it "
        "would have grown past this worker's memory limit (its blocks "
        "faulted in again each time: a limit with room to spare avoids it)",
        a.stage(), a.job_id(),
        n == 1 ? std::string("once") : absl::StrCat(n, " times"));
  }
  if (x.reduced_steps > 0) {
    LogInfo(
        "stage %d of %s (replica %d of %d): %d gradient sums with the other "
        "replicas, %.3f s, %s sent and received (%.2f GB/s)",
        a.stage(), a.job_id(), a.replica(), x.replicas, x.reduced_steps,
        x.reduced_seconds, FormatBytes(x.reduced_bytes),
        x.reduced_seconds > 0 ? x.reduced_bytes / x.reduced_seconds * 1e-9
                              : 0.0);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (current_ == run) current_ = nullptr;
  cv_.notify_all();  // the reaper waits for no assignment to run
}

absl::StatusOr<int64_t> Executor::CheckMemory(
    const std::vector<std::unique_ptr<Execution>>& xs) const {
  if (HostBudget() <= 0) return 0;
  ASSIGN_OR_RETURN(const ModelShapes shapes,
                   InferModelShapes(xs.front()->spec.model()));
  std::vector<StageMemory> needs;
  std::string said;
  for (const auto& x : xs) {
    StageMemoryPlacement p;
    p.stage = x->placement.index;
    p.stages = x->placement.count;
    p.layer_begin = x->placement.layer_begin;
    p.layer_end = x->placement.layer_end;
    p.micro_batches = x->placement.micro_batches;
    p.schedule = x->placement.schedule;
    p.virtual_stages = static_cast<int64_t>(xs.size());
    p.remat = x->placement.remat;
    ASSIGN_OR_RETURN(p.order_ticks, AssignedPhaseTicks(x->a));
    if (p.layer_begin < 0 || p.layer_end <= p.layer_begin ||
        p.layer_end > static_cast<int64_t>(shapes.costs.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "assignment's layers [", p.layer_begin, ", ", p.layer_end,
          ") are not within the model's ", shapes.costs.size()));
    }
    needs.push_back(EstimateStageMemory(x->spec, shapes, p));
    absl::StrAppend(&said, said.empty() ? "" : "; ", "stage ", p.stage,
                    " needs ", needs.back().ToString());
  }
  // The worker's chunks together, as the controller placed them.
  const int64_t total = Combined(needs).total();
  // A state kept for this assignment's resume from memory is a copy beside
  // the stage's own until the resume has loaded it.
  const int64_t parked = parked_ != nullptr ? ParkedBytes(*parked_) : 0;
  const int64_t need = SaturatingSum({total, parked});
  if (need <= memory_budget_) return need;
  return MemoryError(absl::StrCat(
      said,
      xs.size() > 1 ? absl::StrCat(" (", FormatBytes(total), " together)")
                    : std::string(),
      parked > 0 ? absl::StrCat(" and ", FormatBytes(parked),
                                " for the state it resumes from")
                 : std::string(),
      ", more than this worker's memory for stages, ",
      FormatBytes(memory_budget_), " (gpipe-worker --memory_limit)"));
}

int64_t Executor::SegmentRoom(const std::vector<std::unique_ptr<Execution>>& xs,
                              int64_t need) const {
  constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();
  if (HostBudget() <= 0) return kUnbounded;
  const auto runs = [&](int64_t stage) {
    return std::any_of(xs.begin(), xs.end(),
                       [&](const auto& c) { return c->a.stage() == stage; });
  };
  // The links this worker dials: to the next stage where another worker
  // runs it (the next chunk of its own talks in process), and to the
  // replicas above its own.
  const Execution& x = *xs.front();
  int64_t links = x.replicas - 1 - x.a.replica();
  for (const auto& c : xs)
    if (!c->last && !runs(c->a.stage() + 1)) ++links;
  if (links <= 0) return kUnbounded;
  return std::max<int64_t>(0, memory_budget_ - need) / links;
}

int64_t Executor::TensorLimit(
    const std::vector<std::unique_ptr<Execution>>& xs) const {
  if (HostBudget() <= 0) return 0;
  // Never below what the stages need: the smallest segment may exceed the
  // room it was given (FitRings), and that comes from the reserve.
  return std::max(
      {int64_t{1}, xs.front()->run->need, memory_budget_ - MappedBytes(xs)});
}

int64_t Executor::MappedBytes(
    const std::vector<std::unique_ptr<Execution>>& xs) const {
  int64_t mapped = 0;
  for (const auto& c : xs) {
    if (c->downstream != nullptr) mapped += c->downstream->mapped_bytes();
    for (const auto& link : c->dialed_replicas) mapped += link->mapped_bytes();
  }
  return mapped;
}

absl::Status Executor::LinkOwnChunks(
    Run& run, const std::vector<std::unique_ptr<Execution>>& xs) {
  for (const auto& c : xs) {
    for (const auto& d : xs) {
      if (d->a.stage() != c->a.stage() + 1) continue;
      // Each direction holds a whole step's messages, as in process: this
      // thread sends before it receives.
      auto [down, up] =
          MakeInProcessLinkPair(static_cast<size_t>(c->a.micro_batches()) + 4);
      c->downstream = std::move(down);
      c->data_plane = "in_process";
      if (c->metrics != nullptr) c->metrics->SetDataPlane(c->data_plane);
      std::lock_guard<std::mutex> lock(mu_);
      if (run.cancelled) return absl::CancelledError("cancelled");
      run.downstreams.push_back(c->downstream.get());
      run.upstreams[d->a.stage()] = std::shared_ptr<Link>(std::move(up));
    }
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status Executor::ConnectDownstream(Execution& x) {
  auto is_cancelled = [&] { return cancelled(*x.run); };
  ASSIGN_OR_RETURN(x.downstream,
                   connector_->Connect(x.a, x.run->segment_room, is_cancelled));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (x.run->cancelled) return absl::CancelledError("cancelled");
    x.run->downstreams.push_back(x.downstream.get());
  }
  ASSIGN_OR_RETURN(AgreedPlane plane, connector_->AwaitDataPlane(
                                          *x.downstream, x.a, is_cancelled));
  x.data_plane = std::move(plane.name);
  x.data_plane_reason = std::move(plane.reason);
  if (x.metrics != nullptr) x.metrics->SetDataPlane(x.data_plane);
  return absl::OkStatus();
}

absl::Status Executor::AwaitUpstream(Execution& x) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t stage = x.a.stage();
  if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] {
        return x.run->cancelled || x.run->upstreams.contains(stage);
      })) {
    return absl::DeadlineExceededError(
        absl::StrCat("stage ", stage - 1, " did not connect within 60 s"));
  }
  if (x.run->cancelled) return absl::CancelledError("cancelled");
  x.upstream = x.run->upstreams.at(stage);
  return absl::OkStatus();
}

absl::Status Executor::ConnectReplicas(Execution& x) {
  if (x.replicas == 1) return absl::OkStatus();
  const int64_t me = x.a.replica();
  auto is_cancelled = [&] { return cancelled(*x.run); };
  std::vector<Link*> peers(x.replicas, nullptr);
  for (int64_t q = me + 1; q < x.replicas; ++q) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<Link> link,
        connector_->ConnectReplica(x.a, q, x.run->segment_room, is_cancelled));
    peers[q] = link.get();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (x.run->cancelled) {
        link->Close();
        return absl::CancelledError("cancelled");
      }
      x.run->dialed_replicas.push_back(link.get());
    }
    x.dialed_replicas.push_back(std::move(link));
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] {
          return x.run->cancelled ||
                 static_cast<int64_t>(x.run->replica_links.size()) == me;
        })) {
      return absl::DeadlineExceededError(
          absl::StrCat("replica ", me, " of stage ", x.a.stage(),
                       " heard from ", x.run->replica_links.size(), " of the ",
                       me, " replicas below it within 60 s"));
    }
    if (x.run->cancelled) return absl::CancelledError("cancelled");
    for (auto& [q, link] : x.run->replica_links) {
      peers[q] = link.get();
      x.accepted_replicas.push_back(link);
    }
  }
  const int64_t groups = x.placement.gradient_groups;
  std::vector<RowRange> shares;
  for (int64_t q = 0; q < x.replicas; ++q)
    shares.push_back(ReplicaGroups(groups, x.replicas, q));
  x.reduction =
      std::make_unique<LinkReduction>(me, groups, std::move(shares), peers);
  const RowRange mine =
      ReplicaMicroBatches(x.placement.micro_batches, groups, x.replicas, me);
  x.placement.micro_batch_begin = mine.begin;
  x.placement.micro_batch_end = mine.end;
  x.placement.replica = me;
  x.placement.reducer = x.reduction.get();
  x.replica_peers = peers;
  LogInfo("stage %d of %s: replica %d of %d, micro-batches [%d, %d)",
          x.a.stage(), x.a.job_id(), me, x.replicas, mine.begin, mine.end);
  return absl::OkStatus();
}

absl::Status Executor::BuildStage(Execution& x) {
  Link* up = x.upstream.get();
  Link* down = x.downstream.get();
  if (x.metrics != nullptr) {
    if (up != nullptr) {
      x.metered_up = std::make_unique<MeteredLink>(up, x.metrics.get());
      up = x.metered_up.get();
    }
    if (down != nullptr) {
      x.metered_down = std::make_unique<MeteredLink>(down, x.metrics.get());
      down = x.metered_down.get();
    }
  }
  ASSIGN_OR_RETURN(x.stage,
                   Stage::Create(x.spec, x.placement, x.dataset, up, down));
  return absl::OkStatus();
}

absl::StatusOr<StageFileStore*> Executor::FilesFor(
    const gpipe::v1::Assignment& a) {
  if (a.checkpoint_transport() != gpipe::v1::CHECKPOINT_TRANSPORT_CONTROLLER) {
    return &shared_files_;
  }
  if (controller_files_ == nullptr) {
    return absl::FailedPreconditionError(
        "the assignment sends its files through the controller, and this "
        "worker has no connection for them");
  }
  return controller_files_.get();
}

absl::Status Executor::Restore(Execution& x) {
  const gpipe::v1::Assignment& a = x.a;
  if (a.resume_in_memory()) return ResumeInMemory(x);
  const bool through_controller =
      a.checkpoint_transport() == gpipe::v1::CHECKPOINT_TRANSPORT_CONTROLLER;
  if (through_controller ? a.restore_step() == 0
                         : a.restore_manifest().empty()) {
    return x.spec.has_init_from() ? InitFrom(x) : absl::OkStatus();
  }
  absl::StatusOr<StageFileStore*> files = FilesFor(a);
  if (!files.ok()) return CheckpointError(files.status());
  absl::StatusOr<int64_t> restored = (*files)->Restore(a, *x.stage);
  if (!restored.ok()) return CheckpointError(restored.status());
  const std::string from =
      through_controller ? std::string("the controller") : a.restore_manifest();
  if (*restored != a.start_step()) {
    return CheckpointError(absl::DataLossError(
        absl::StrCat(from, " sent a checkpoint of step ", *restored,
                     ", the assignment starts at ", a.start_step())));
  }
  LogInfo("stage %d of %s restored step %d from %s", a.stage(), a.job_id(),
          *restored, from);
  return absl::OkStatus();
}

absl::Status Executor::ResumeInMemory(Execution& x) {
  const gpipe::v1::Assignment& a = x.a;
  absl::StatusOr<int64_t> from = ResumeFromMemory(
      *x.stage, x.spec, a.replica(), x.replica_peers, parked_.get(), a.job_id(),
      a.start_step(),
      a.resume_roll_forward()
          ? std::optional<double>(a.resume_roll_forward_squares())
          : std::nullopt);
  if (from.ok()) SetParked(nullptr);  // the stage holds it now
  if (!from.ok()) {
    return absl::Status(
        from.status().code(),
        absl::StrCat(kResumeErrorPrefix, from.status().message()));
  }
  LogInfo("stage %d of %s (replica %d) resumed step %d from %s, no checkpoint",
          a.stage(), a.job_id(), a.replica(), a.start_step(),
          *from == a.replica() ? std::string("its own memory")
                               : absl::StrCat("replica ", *from, "'s memory"));
  return absl::OkStatus();
}

void Executor::Park(Execution& x) {
  // Only a job of replicas (even when it runs one for now). A failed step
  // leaves no half-moved buffer: batch norm's running averages move with
  // the update (Stage::GatherRunningStatistics).
  if (ReplicaCount(x.spec) == 1) return;
  gpipe::v1::WorkerMessage m;
  gpipe::v1::StageParked* p = m.mutable_parked();
  p->set_job_id(x.a.job_id());
  p->set_epoch(x.a.epoch());
  p->set_stage(x.a.stage());
  p->set_replica(x.a.replica());
  p->set_layer_begin(x.a.layer_begin());
  p->set_layer_end(x.a.layer_end());
  // At a step boundary with untorn parameters. An update applied just
  // before a cancel cut the step's bookkeeping short still moved the state
  // on.
  if (x.stage != nullptr && x.done_steps >= 0 &&
      !x.stage->update_in_progress()) {
    const int64_t step =
        std::max(x.done_steps, x.stage->last_update_step() + 1);
    SetParked(nullptr);
    try {
      SetParked(std::make_unique<ParkedStage>(
          ParkStage(*x.stage, x.spec, x.a.job_id(), step)));
    } catch (const std::bad_alloc&) {
      LogWarning("stage %d of %s: no memory to keep its state for a resume",
                 x.a.stage(), x.a.job_id());
    }
  }
  // What it holds: this run's state, or (a resume that ended before it
  // used it) the one it was given, if it is for these layers.
  const bool holds = parked_ != nullptr &&
                     parked_->layer_begin == x.a.layer_begin() &&
                     parked_->layer_end == x.a.layer_end();
  p->set_step(holds ? parked_->step : -1);  // -1: nothing kept
  p->set_pending_update(holds && parked_->pending);
  p->set_last_update_step(holds ? parked_->last_update_step : -1);
  p->set_last_update_squares(holds ? parked_->last_update_squares : 0);
  if (holds) {
    LogInfo("stage %d of %s (replica %d): keeps its state after step %d%s",
            x.a.stage(), x.a.job_id(), x.a.replica(), parked_->step,
            parked_->pending ? absl::StrCat(", the update of step ",
                                            parked_->step, " pending")
                             : std::string());
  }
  // Said either way: the controller then need not wait for this worker.
  report_(m);
}

absl::Status Executor::InitFrom(Execution& x) {
  const gpipe::v1::InitFrom& init = x.spec.init_from();
  ASSIGN_OR_RETURN(const InitWeights weights, ReadInitWeights(init.path()));
  if (init.optimizer_state() && weights.step != init.step()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_from.path: ", init.path(), " now holds step ",
        weights.step.value_or(0), ", the job was submitted to continue from ",
        init.step(), " (the file changed after submit?)"));
  }
  const StagePlacement& p = x.stage->placement();
  ASSIGN_OR_RETURN(
      const InitReport report,
      LoadInitWeights(weights, init, x.stage->model().StateTensors(),
                      x.stage->optimizer().State(),
                      LayerRange{p.layer_begin, p.layer_end,
                                 x.spec.model().layers_size()}));
  LogInfo("stage %d of %s: init_from %s: %s", x.a.stage(), x.a.job_id(),
          init.path(), report.ToString());
  return absl::OkStatus();
}

void Executor::ClosePipelineLinks(
    const std::vector<std::unique_ptr<Execution>>& xs) {
  for (const auto& x : xs) {
    if (x->upstream) x->upstream->Close();
    if (x->downstream) x->downstream->Close();
  }
}

namespace {

// A stage's part of an evaluation: running out of memory is that part's
// own failure (RunEval told its neighbours), which a final evaluation
// survives with the trained model.
absl::StatusOr<LossResult> EvalPart(Stage& stage, int64_t max_samples) {
  try {
    return stage.RunEval(Split::kTest, max_samples);
  } catch (const std::bad_alloc& e) {
    return MarkEvalFailedHere(MemoryError(e.what()));
  }
}

}  // namespace

absl::StatusOr<LossResult> Executor::Evaluate(
    const std::vector<std::unique_ptr<Execution>>& xs) {
  const int64_t max_samples = xs.front()->spec.eval().max_samples();
  if (xs.size() == 1) return EvalPart(*xs.front()->stage, max_samples);
  // Each chunk on a thread of its own: a chunk's batches come from a
  // chunk of the worker before, which waits for this worker's other chunks
  // in turn. A failed chunk closes every link, so none waits for it.
  const std::shared_ptr<Run>& run = xs.front()->run;
  std::vector<absl::StatusOr<LossResult>> results(
      xs.size(), absl::UnknownError("not run"));
  const auto evaluate = [&](size_t c) {
    SetComputeThreads(threads_);
    TensorMemoryLimit limit(TensorLimit(xs));
    AllocationsCancelledBy stop(&run->stop);
    try {
      results[c] = EvalPart(*xs[c]->stage, max_samples);
    } catch (const AllocationCancelled&) {
      results[c] = absl::CancelledError("cancelled while computing");
    }
    // A failed part told its neighbours, this worker's other chunks among
    // them; anything else (a lost link) leaves them waiting.
    const absl::Status& s = results[c].status();
    if (!s.ok() && !EvalFailedHere(s) && !EvalEndedElsewhere(s))
      ClosePipelineLinks(xs);
  };
  std::vector<std::thread> threads;
  try {
    for (size_t c = 1; c < xs.size(); ++c) threads.emplace_back(evaluate, c);
  } catch (const std::system_error& e) {
    // No thread for a chunk: the others would wait for it for ever.
    ClosePipelineLinks(xs);
    for (std::thread& t : threads) t.join();
    return absl::ResourceExhaustedError(
        absl::StrCat("no thread to evaluate a chunk: ", e.what()));
  }
  evaluate(0);
  for (std::thread& t : threads) t.join();
  // The error that caused the others (they only see closed links).
  std::vector<absl::Status> statuses;
  LossResult last;
  for (size_t c = 0; c < xs.size(); ++c) {
    statuses.push_back(results[c].status());
    if (results[c].ok() && xs[c]->last) last = *results[c];
  }
  // The part that failed says why, not the chunks it ended.
  RETURN_IF_ERROR(FirstCause(statuses));
  return last;
}

absl::Status Executor::RunSteps(
    const std::vector<std::unique_ptr<Execution>>& xs) {
  Execution& x = *xs.front();
  const gpipe::v1::Assignment& a = x.a;
  // The chunk that runs the pipeline's last stage, if this worker has it:
  // it reports the evaluations.
  const Execution* last = nullptr;
  std::vector<Stage*> stages;
  for (const auto& c : xs) {
    if (c->last) last = c.get();
    stages.push_back(c->stage.get());
  }
  const int64_t v = static_cast<int64_t>(xs.size());
  ASSIGN_OR_RETURN(const std::vector<PhaseTicks> ticks, AssignedPhaseTicks(a));
  const std::vector<Op> ops =
      v > 1 ? WithTransfers(
                  MakeWorkerSchedule(x.placement.schedule, a.stages() / v,
                                     a.micro_batches(), v, a.stage(), ticks),
                  x.placement.schedule, a.stages() / v, v, a.stage())
            : std::vector<Op>();
  const auto evaluate = [&](int64_t step) -> absl::Status {
    ASSIGN_OR_RETURN(LossResult e, Evaluate(xs));
    if (last != nullptr && e.counted > 0) report_(Evaluated(last->a, step, e));
    return absl::OkStatus();
  };
  // A resume from memory may start where a cancel cut the evaluation of
  // its step short: it runs first (the controller keeps one per step).
  if (a.resume_in_memory() && x.writes && a.start_step() > 0 &&
      x.plan.EvaluatesAfter(a.start_step())) {
    RETURN_IF_ERROR(evaluate(a.start_step()));
  }
  for (int64_t s = a.start_step(); s < x.spec.steps(); ++s) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<StageStepResult> results;
    if (v == 1) {
      ASSIGN_OR_RETURN(StageStepResult r, x.stage->RunStep(s));
      results.push_back(std::move(r));
    } else {
      ASSIGN_OR_RETURN(results, RunWorkerStep(stages, ops, s));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    double busy = 0;  // the worker's, all its chunks together
    for (const auto& c : xs)
      busy += c->stage->timeline().LastStep().busy_seconds();
    for (int64_t c = 0; c < v; ++c) {
      xs[c]->done_steps = s + 1;
      ReportStep(*xs[c], s, results[c], seconds, busy);
    }
    if (cancelled(*x.run)) return absl::CancelledError("cancelled");
    const int64_t done = s + 1;
    // The evaluation before the checkpoint: the last stage's evaluation
    // report then precedes its checkpoint report on the Attach stream, so a
    // committed checkpoint never lacks the evaluation of its step (a stage
    // killed after the commit would otherwise resume past an evaluation
    // nobody made). Evaluating changes no state, so the order is free.
    // As `gpipectl train` does; all stages take part.
    if (x.writes && x.plan.EvaluatesAfter(done)) {
      RETURN_IF_ERROR(evaluate(done));
    }
    if (x.writes && x.plan.CheckpointsAfter(done) &&
        (a.checkpoint_transport() ==
             gpipe::v1::CHECKPOINT_TRANSPORT_CONTROLLER ||
         !a.checkpoint_dir().empty())) {
      for (const auto& c : xs) RETURN_IF_ERROR(Checkpoint(*c, done));
    }
  }
  return absl::OkStatus();
}

// The step's op timeline (every trace_every_ steps), then its progress.
void Executor::ReportStep(Execution& x, int64_t step, const StageStepResult& r,
                          double seconds, double worker_busy_seconds) {
  const gpipe::v1::Assignment& a = x.a;
  const StepTimeline t = x.stage->timeline().LastStep();
  if (trace_every_ > 0 && step % trace_every_ == 0) {
    gpipe::v1::WorkerMessage trace;
    *trace.mutable_trace() =
        ToStepTrace(t, a.stage(), UnixNsAtOrigin(x.stage->timeline()));
    trace.mutable_trace()->set_job_id(a.job_id());
    trace.mutable_trace()->set_epoch(a.epoch());
    trace.mutable_trace()->set_replica(a.replica());
    report_(trace);
  }
  gpipe::v1::WorkerMessage m;
  auto* p = m.mutable_progress();
  p->set_job_id(a.job_id());
  p->set_epoch(a.epoch());
  p->set_stage(a.stage());
  p->set_step(step + 1);
  p->set_replica(a.replica());
  if (x.last) {
    p->set_loss(r.loss.loss_sum / r.loss_normalizer);
    if (x.replicas > 1) {
      p->set_loss_normalizer(r.loss_normalizer);
      const int64_t end = std::min<int64_t>(
          x.placement.local_end(), static_cast<int64_t>(r.losses.size()));
      for (int64_t mb = x.placement.micro_batch_begin; mb < end; ++mb) {
        gpipe::v1::MicroBatchLoss* l = p->add_micro_batch_losses();
        l->set_micro_batch(mb);
        l->set_loss_sum(r.losses[mb].loss_sum);
        l->set_correct(r.losses[mb].correct);
        l->set_counted(r.losses[mb].counted);
      }
    }
    p->set_accuracy(r.loss.counted > 0
                        ? static_cast<double>(r.loss.correct) / r.loss.counted
                        : 0.0);
  }
  p->set_step_seconds(seconds);
  p->set_busy_seconds(t.busy_seconds());
  p->set_update_seconds(t.busy_seconds(Phase::kOptimizer));
  // The stage is not idle while its thread computes another of its
  // worker's stages: with chunks, its bubble is its worker's.
  const double others = std::max(0.0, worker_busy_seconds - t.busy_seconds());
  p->set_bubble_seconds(std::max(0.0, t.bubble_seconds() - others));
  p->set_peak_activation_bytes(r.peak_activation_bytes);
  p->set_data_plane(x.data_plane);
  p->set_data_plane_reason(x.data_plane_reason);
  if (x.downstream != nullptr)
    p->set_segment_bytes(x.downstream->mapped_bytes());
  if (const LayerTiming* timing = x.stage->layer_timing()) {
    for (double f : timing->forward_seconds()) p->add_layer_forward_seconds(f);
    for (double b : timing->backward_seconds())
      p->add_layer_backward_seconds(b);
  }
  if (x.metrics != nullptr) {
    StepOutcome report;
    report.completed_steps = step + 1;
    report.samples = ReplicaSamples(x.placement, x.spec.batch_size());
    report.peak_activation_bytes = r.peak_activation_bytes;
    if (x.last) report.loss = p->loss();
    report.other_stages_busy_seconds = others;
    x.metrics->ObserveStep(t, report);
  }
  if (x.reduction != nullptr) {
    const int64_t moved =
        x.reduction->bytes_sent() + x.reduction->bytes_received();
    ++x.reduced_steps;
    x.reduced_seconds += x.stage->reduce_seconds();
    if (x.metrics != nullptr) {
      x.metrics->ObserveReduction(x.stage->reduce_seconds(),
                                  moved - x.reduced_bytes);
    }
    x.reduced_bytes = moved;
  }
  report_(m);
}

absl::Status Executor::Checkpoint(Execution& x, int64_t done) {
  const gpipe::v1::Assignment& a = x.a;
  absl::StatusOr<StageFileStore*> files = FilesFor(a);
  if (!files.ok()) return CheckpointError(files.status());
  absl::StatusOr<StageFileStore::Stored> stored =
      (*files)->SaveCheckpoint(a, *x.stage, done);
  if (!stored.ok()) return CheckpointError(stored.status());
  report_(CheckpointedReport(a, done, *stored));
  return absl::OkStatus();
}

// The final evaluation (all stages take part; the last reports it) and the
// stages' final parameters, saved in the assignment's store; with replicas
// replica 0 does both, for all.
absl::Status Executor::Finish(
    const std::vector<std::unique_ptr<Execution>>& xs) {
  std::vector<gpipe::v1::WorkerMessage> finished;
  for (const auto& x : xs) {
    gpipe::v1::WorkerMessage& m = finished.emplace_back();
    auto* f = m.mutable_finished();
    f->set_job_id(x->a.job_id());
    f->set_epoch(x->a.epoch());
    f->set_stage(x->a.stage());
    f->set_replica(x->a.replica());
  }
  if (xs.front()->writes) {
    // The trained parameters first: an evaluation that fails keeps them.
    for (size_t c = 0; c < xs.size(); ++c) {
      const Execution& x = *xs[c];
      ASSIGN_OR_RETURN(StageFileStore * files, FilesFor(x.a));
      // Marked as a checkpoint's failure: a full store is waited out
      // without spending restarts, as for any checkpoint (it failed the job
      // as a lost link, "LinkFailed", after every restart).
      absl::StatusOr<StageFileStore::Stored> stored =
          files->SaveFinal(x.a, *x.stage);
      if (!stored.ok()) return CheckpointError(stored.status());
      finished[c].mutable_finished()->set_parameters_path(stored->path);
    }
    const absl::StatusOr<LossResult> eval = Evaluate(xs);
    if (eval.ok()) {
      for (size_t c = 0; c < xs.size(); ++c) {
        if (xs[c]->last && eval->counted > 0) {
          *finished[c].mutable_finished()->mutable_evaluation() =
              ToEvaluation(xs[c]->spec.steps(), *eval);
        }
      }
    } else if (EvalFailedHere(eval.status()) ||
               EvalEndedElsewhere(eval.status())) {
      // Every stage ended its part and the training is done: the job keeps
      // its model and says why it has no final evaluation. A lost link
      // (below) restarts the job instead, which evaluates again.
      LogWarning("stage %d of %s: the final evaluation failed: %s",
                 xs.front()->a.stage(), xs.front()->a.job_id(),
                 std::string(eval.status().message()));
      for (gpipe::v1::WorkerMessage& m : finished) {
        m.mutable_finished()->set_evaluation_error(
            std::string(eval.status().message()));
        m.mutable_finished()->set_evaluation_failed_here(
            EvalFailedHere(eval.status()));
      }
    } else {
      return eval.status();
    }
  }
  for (const gpipe::v1::WorkerMessage& m : finished) report_(m);
  return absl::OkStatus();
}

}  // namespace gpipe
