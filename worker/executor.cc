#include "worker/executor.h"

#include <chrono>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/core/log.h"
#include "services/core/status.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/stage.h"
#include "services/pipeline/stage_checkpoint.h"
#include "services/security/stream_key.h"
#include "services/storage/safetensors.h"
#include "services/telemetry/metered_link.h"
#include "services/telemetry/step_trace.h"
#include "services/tensor/threads.h"

namespace gpipe {

struct Executor::Run {
  gpipe::v1::Assignment assignment;
  bool cancelled = false;
  std::shared_ptr<GrpcLink> upstream;  // set by AcceptUpstream
  Link* downstream = nullptr;          // while connected, for Cancel
};

Executor::Executor(int threads, Reporter report, PipelineMetrics* metrics,
                   Device device)
    : threads_(threads),
      report_(std::move(report)),
      metrics_(metrics),
      device_(device) {}

Executor::~Executor() { CancelAll(); }

bool Executor::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_ != nullptr;
}

void Executor::StopLocked(std::unique_lock<std::mutex>& lock) {
  if (current_ != nullptr) {
    current_->cancelled = true;
    if (current_->upstream) current_->upstream->Close();
    if (current_->downstream) current_->downstream->Close();
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    std::thread t = std::move(thread_);
    lock.unlock();
    t.join();
    lock.lock();
  }
}

void Executor::Start(const gpipe::v1::Assignment& a) {
  std::unique_lock<std::mutex> lock(mu_);
  StopLocked(lock);
  auto run = std::make_shared<Run>();
  run->assignment = a;
  current_ = run;
  cv_.notify_all();
  thread_ = std::thread([this, run] { Execute(run); });
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

void Executor::CancelAll() {
  std::unique_lock<std::mutex> lock(mu_);
  StopLocked(lock);
}

absl::Status Executor::AcceptUpstream(const std::string& job_id, int64_t epoch,
                                      int64_t from_stage,
                                      std::shared_ptr<GrpcLink> link,
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
        if (from_stage != a.stage() - 1) {
          return absl::FailedPreconditionError(absl::StrCat(
              "link from stage ", from_stage, " but this worker runs stage ",
              a.stage(), " of job ", job_id));
        }
        if (current_->upstream != nullptr) {
          return absl::AlreadyExistsError(
              absl::StrCat("stage ", a.stage(), " of job ", job_id, " epoch ",
                           epoch, " already has its upstream link"));
        }
        current_->upstream = std::move(link);
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

namespace {

constexpr absl::string_view kCheckpointErrorPrefix = "checkpoint: ";

gpipe::v1::WorkerMessage Failure(const gpipe::v1::Assignment& a,
                                 const absl::Status& status) {
  gpipe::v1::WorkerMessage m;
  auto* f = m.mutable_failed();
  f->set_job_id(a.job_id());
  f->set_epoch(a.epoch());
  f->set_stage(a.stage());
  f->set_message(std::string(status.message()));
  // Neither a loss that is not finite nor bad data gets better by retrying;
  // a lost neighbour or link does.
  // A checkpoint that cannot be written or restored is retried too: the
  // controller then falls back to the previous committed checkpoint.
  const bool loss = absl::StrContains(status.message(), "loss is not finite");
  const bool checkpoint =
      absl::StartsWith(status.message(), kCheckpointErrorPrefix);
  const bool data =
      !checkpoint && (absl::IsInvalidArgument(status) ||
                      absl::IsNotFound(status) || absl::IsDataLoss(status));
  f->set_permanent(loss || data);
  f->set_reason(loss         ? "LossNotFinite"
                : checkpoint ? "CheckpointFailed"
                : data       ? "InvalidData"
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

}  // namespace

// The next stage's answer to this stage's data-plane offer, in short waits
// so that a cancel is noticed; logged and exported.
absl::StatusOr<DataPlane> Executor::AwaitDataPlane(
    GrpcClientLink& link, const gpipe::v1::Assignment& a,
    const std::function<bool()>& cancelled,
    const std::shared_ptr<StageMetrics>& metrics) {
  for (;;) {
    absl::StatusOr<DataPlane> plane =
        link.link().WaitDataPlane(std::chrono::milliseconds(250));
    if (plane.ok()) {
      const std::string refusal = link.link().data_plane_refusal();
      LogInfo(
          "stage %d of %s: data plane to stage %d is %s (--data_plane %s)%s",
          a.stage(), a.job_id(), a.stage() + 1, DataPlaneName(*plane),
          DataPlaneModeName(data_plane_.mode),
          refusal.empty()
              ? std::string()
              : absl::StrCat(*plane == DataPlane::kGrpc &&
                                     !absl::StartsWith(refusal, "no CUDA IPC")
                                 ? ": no shared memory: "
                                 : ": ",
                             refusal));
      if (metrics != nullptr) metrics->SetDataPlane(DataPlaneName(*plane));
      return *plane;
    }
    if (!absl::IsDeadlineExceeded(plane.status())) return plane.status();
    if (cancelled()) return absl::CancelledError("cancelled");
  }
}

void Executor::Execute(std::shared_ptr<Run> run) {
  SetComputeThreads(threads_);
  const gpipe::v1::Assignment& a = run->assignment;
  const gpipe::v1::JobSpec& spec = a.spec();
  const bool first = a.stage() == 0, last = a.stage() == a.stages() - 1;
  const size_t capacity = static_cast<size_t>(a.micro_batches()) + 4;
  LogInfo("running stage %d/%d of %s (epoch %d): layers [%d, %d), M=%d",
          a.stage(), a.stages(), a.job_id(), a.epoch(), a.layer_begin(),
          a.layer_end(), a.micro_batches());

  auto cancelled = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return run->cancelled;
  };
  std::unique_ptr<Link> downstream;
  std::shared_ptr<GrpcLink> upstream;
  std::shared_ptr<StageMetrics> stage_metrics;
  if (metrics_ != nullptr) {
    stage_metrics = metrics_->ForStage(a.job_id(), a.stage(), a.stages(),
                                       a.micro_batches(), last);
  }
  std::unique_ptr<MeteredLink> metered_up, metered_down;
  std::string data_plane_name;  // of the link downstream, for progress
  absl::Status status = [&]() -> absl::Status {
    std::shared_ptr<const Dataset> dataset;
    if (first || last) {
      ASSIGN_OR_RETURN(std::unique_ptr<Dataset> d, OpenJobDataset(spec));
      dataset = std::move(d);
    }
    if (!last) {
      // In short attempts, so that a cancel (the job restarted: the peer
      // may be dead) is noticed within a second rather than after 30.
      absl::Status connected = absl::UnavailableError("not tried");
      GrpcClientLink* client = nullptr;
      for (int attempt = 0; attempt < 30 && !cancelled(); ++attempt) {
        absl::StatusOr<std::unique_ptr<GrpcClientLink>> link =
            ConnectDownstream(a.downstream_address(), a.job_id(), a.epoch(),
                              a.stage(), capacity, 1000, FrameCodec::kOneCopy,
                              data_plane_, [&] {
                                ExchangeCredentials c = exchange_credentials_;
                                c.stream_key = a.stream_key();
                                return c;
                              }());
        if (link.ok()) {
          client = link->get();
          downstream = std::move(*link);
          connected = absl::OkStatus();
          break;
        }
        connected = link.status();
        if (!absl::IsUnavailable(connected)) break;
      }
      if (cancelled()) return absl::CancelledError("cancelled");
      RETURN_IF_ERROR(connected);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (run->cancelled) return absl::CancelledError("cancelled");
        run->downstream = downstream.get();
      }
      ASSIGN_OR_RETURN(DataPlane plane,
                       AwaitDataPlane(*client, a, cancelled, stage_metrics));
      data_plane_name = DataPlaneName(plane);
    }
    if (!first) {
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] {
            return run->cancelled || run->upstream != nullptr;
          })) {
        return absl::DeadlineExceededError(absl::StrCat(
            "stage ", a.stage() - 1, " did not connect within 60 s"));
      }
      if (run->cancelled) return absl::CancelledError("cancelled");
      upstream = run->upstream;
    }
    StagePlacement placement;
    placement.index = a.stage();
    placement.count = a.stages();
    placement.layer_begin = a.layer_begin();
    placement.layer_end = a.layer_end();
    placement.micro_batches = a.micro_batches();
    placement.schedule = a.schedule() == gpipe::v1::ONE_F_ONE_B
                             ? ScheduleKind::kOneFOneB
                             : ScheduleKind::kGPipe;
    placement.remat = RematFromSpec(a.remat());
    Link* up = upstream.get();
    Link* down = downstream.get();
    if (stage_metrics != nullptr) {
      if (up != nullptr) {
        metered_up = std::make_unique<MeteredLink>(up, stage_metrics.get());
        up = metered_up.get();
      }
      if (down != nullptr) {
        metered_down = std::make_unique<MeteredLink>(down, stage_metrics.get());
        down = metered_down.get();
      }
    }
    placement.device = device_;
    ASSIGN_OR_RETURN(std::unique_ptr<Stage> stage,
                     Stage::Create(spec, placement, dataset, up, down));
    if (!a.restore_manifest().empty()) {
      absl::StatusOr<int64_t> restored =
          RestoreStageCheckpoint(*stage, a.restore_manifest());
      if (!restored.ok()) return CheckpointError(restored.status());
      if (*restored != a.start_step()) {
        return CheckpointError(absl::DataLossError(
            absl::StrCat(a.restore_manifest(), " is of step ", *restored,
                         ", the assignment starts at ", a.start_step())));
      }
      LogInfo("stage %d of %s restored step %d from %s", a.stage(), a.job_id(),
              *restored, a.restore_manifest());
    }
    const int64_t every = spec.checkpoint().every();
    for (int64_t s = a.start_step(); s < spec.steps(); ++s) {
      const auto start = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(StageStepResult r, stage->RunStep(s));
      const double seconds = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - start)
                                 .count();
      const StepTimeline t = stage->timeline().LastStep();
      if (trace_every_ > 0 && s % trace_every_ == 0) {
        gpipe::v1::WorkerMessage trace;
        *trace.mutable_trace() =
            ToStepTrace(t, a.stage(), UnixNsAtOrigin(stage->timeline()));
        trace.mutable_trace()->set_job_id(a.job_id());
        trace.mutable_trace()->set_epoch(a.epoch());
        report_(trace);
      }
      gpipe::v1::WorkerMessage m;
      auto* p = m.mutable_progress();
      p->set_job_id(a.job_id());
      p->set_epoch(a.epoch());
      p->set_stage(a.stage());
      p->set_step(s + 1);
      if (last) {
        p->set_loss(r.loss.loss_sum / r.loss_normalizer);
        p->set_accuracy(r.loss.counted > 0
                            ? static_cast<double>(r.loss.correct) /
                                  r.loss.counted
                            : 0.0);
      }
      p->set_step_seconds(seconds);
      p->set_busy_seconds(t.busy_seconds());
      p->set_bubble_seconds(t.bubble_seconds());
      p->set_peak_activation_bytes(r.peak_activation_bytes);
      p->set_data_plane(data_plane_name);
      if (stage_metrics != nullptr) {
        StepOutcome report;
        report.completed_steps = s + 1;
        report.samples = spec.batch_size();
        report.peak_activation_bytes = r.peak_activation_bytes;
        if (last) report.loss = p->loss();
        stage_metrics->ObserveStep(t, report);
      }
      report_(m);
      if (cancelled()) return absl::CancelledError("cancelled");
      const int64_t done = s + 1;
      if (every > 0 && done % every == 0 && done < spec.steps() &&
          !a.checkpoint_dir().empty()) {
        // Named by epoch: a stale worker of an older epoch that wakes up
        // writes beside the current files, never over them.
        const std::string path =
            absl::StrCat(a.checkpoint_dir(), "/step-", done, "/e", a.epoch(),
                         "-stage-", a.stage(), ".safetensors");
        absl::StatusOr<WrittenCheckpoint> written =
            SaveStageCheckpoint(*stage, done, path);
        if (!written.ok()) return CheckpointError(written.status());
        gpipe::v1::WorkerMessage c;
        auto* r = c.mutable_checkpointed();
        r->set_job_id(a.job_id());
        r->set_epoch(a.epoch());
        r->set_stage(a.stage());
        r->set_step(done);
        r->set_path(path);
        r->set_sha256(written->sha256);
        r->set_bytes(written->bytes);
        r->set_layer_begin(a.layer_begin());
        r->set_layer_end(a.layer_end());
        report_(c);
      }
      // As `gpipectl train` does: every eval.every steps but the last (the
      // final evaluation below covers it). All stages take part.
      const int64_t eval_every = spec.eval().every();
      if (eval_every > 0 && done % eval_every == 0 && done < spec.steps()) {
        ASSIGN_OR_RETURN(
            LossResult e,
            stage->RunEval(Split::kTest, spec.eval().max_samples()));
        if (last && e.counted > 0) report_(Evaluated(a, done, e));
      }
    }
    ASSIGN_OR_RETURN(LossResult eval,
                     stage->RunEval(Split::kTest, spec.eval().max_samples()));
    std::error_code ec;
    std::filesystem::create_directories(a.output_dir(), ec);
    const std::string path = absl::StrCat(a.output_dir(), "/e", a.epoch(),
                                          "-stage-", a.stage(), ".safetensors");
    std::vector<std::pair<std::string, const Tensor*>> tensors;
    for (const NamedTensor& t : stage->model().StateTensors())
      tensors.emplace_back(t.name, t.tensor);
    RETURN_IF_ERROR(WriteSafetensors(path, tensors, {{"format", "pt"}}));
    gpipe::v1::WorkerMessage m;
    auto* f = m.mutable_finished();
    f->set_job_id(a.job_id());
    f->set_epoch(a.epoch());
    f->set_stage(a.stage());
    f->set_parameters_path(path);
    if (last && eval.counted > 0) {
      *f->mutable_evaluation() = ToEvaluation(spec.steps(), eval);
    }
    report_(m);
    return absl::OkStatus();
  }();

  if (!status.ok()) {
    if (upstream) upstream->Close();
    if (downstream) downstream->Close();
    if (!cancelled()) {
      LogWarning("stage %d of %s failed: %s", a.stage(), a.job_id(),
                 std::string(status.message()));
      report_(Failure(a, status));
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    run->downstream = nullptr;
  }
  downstream.reset();  // half-closes and waits for the next stage
  if (upstream) upstream->Release();
  // The stage and its metered links are gone: nothing observes any more.
  if (stage_metrics != nullptr) metrics_->Finish(a.job_id(), a.stage());
  std::lock_guard<std::mutex> lock(mu_);
  if (current_ == run) current_ = nullptr;
}

}  // namespace gpipe
