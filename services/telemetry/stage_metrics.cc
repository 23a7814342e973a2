#include "services/telemetry/stage_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace gpipe {
namespace {

// Micro-batch ops run from sub-millisecond (small layers on a CPU) to
// seconds (large ones); sends are usually far quicker. Steps and ops
// step by about 1.5x where they usually fall, so that a quantile read off
// the buckets lands near the truth: with 0.05 and 0.1 next to each other a
// 49 ms mean step showed an 89 ms p90.
prometheus::Histogram::BucketBoundaries MicroBatchBuckets() {
  return {0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005,
          0.0075,  0.01,   0.015,   0.02,  0.03,   0.05,  0.075, 0.1,
          0.15,    0.2,    0.3,     0.5,   1,      2.5,   5,     10};
}
prometheus::Histogram::BucketBoundaries StepBuckets() {
  return {0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
          0.15,  0.2,    0.3,  0.5,   0.75, 1,    1.5,  2,     3,
          5,     7.5,    10,   15,    20,   30,   60,   120};
}
prometheus::Histogram::BucketBoundaries SendBuckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
          0.01,    0.025,  0.05,    0.1,    0.25,  0.5,    1};
}

constexpr std::array<Phase, kPhaseCount> kPhases = {
    Phase::kForward,   Phase::kBackward,      Phase::kRecompute,
    Phase::kOptimizer, Phase::kBackwardInput, Phase::kBackwardWeight};

}  // namespace

void StageMetrics::ObserveStep(const StepTimeline& step,
                               const StepOutcome& report) {
  StepFigures f = ComputeStepFigures(step);
  if (report.other_stages_busy_seconds > 0) {
    // The ratios are its worker's too, so that each series' utilization
    // and bubble add up to 1 and a job's mean utilization is its workers':
    // the chunk's own share read 0.25 beside a bubble of 0.24 on a ZB-V
    // worker 76% busy. Its own busy time is in the busy counters.
    f.bubble_seconds =
        std::max(0.0, f.bubble_seconds - report.other_stages_busy_seconds);
    f.bubble_ratio =
        f.wall_seconds > 0 ? f.bubble_seconds / f.wall_seconds : 0.0;
    f.utilization_ratio = f.wall_seconds > 0 ? 1.0 - f.bubble_ratio : 0.0;
  }
  for (Phase phase : kPhases) {
    const int i = static_cast<int>(phase);
    busy_[i]->Increment(f.busy_by_phase[i]);
  }
  for (const OpRecord& op : step.ops) {
    if (op.phase == Phase::kOptimizer) continue;  // not a micro-batch
    micro_batch_[static_cast<int>(op.phase)]->Observe(
        std::max<int64_t>(0, op.end_ns - op.start_ns) * 1e-9);
  }
  bubble_->Increment(f.bubble_seconds);
  utilization_->Set(f.utilization_ratio);
  bubble_ratio_->Set(f.bubble_ratio);
  step_duration_->Observe(f.wall_seconds);
  samples_->Increment(
      static_cast<double>(std::max<int64_t>(0, report.samples)));
  step_->Set(static_cast<double>(report.completed_steps));
  if (loss_ != nullptr && report.loss.has_value()) loss_->Set(*report.loss);
  std::lock_guard<std::mutex> lock(mu_);
  peak_bytes_ = std::max(peak_bytes_, report.peak_activation_bytes);
  activation_->Set(static_cast<double>(peak_bytes_));
}

void StageMetrics::StartAt(int64_t step) {
  step_->Set(static_cast<double>(step));
}

void StageMetrics::ObserveSend(int64_t bytes, double seconds) {
  sent_->Increment(static_cast<double>(std::max<int64_t>(0, bytes)));
  send_duration_->Observe(std::max(0.0, seconds));
}

void StageMetrics::ObserveReceive(int64_t bytes) {
  received_->Increment(static_cast<double>(std::max<int64_t>(0, bytes)));
}

void StageMetrics::ObserveReduction(double seconds, int64_t bytes) {
  allreduce_seconds_->Increment(std::max(0.0, seconds));
  allreduce_bytes_->Increment(static_cast<double>(std::max<int64_t>(0, bytes)));
}

prometheus::Labels StageMetrics::Labels() const {
  return {{"job", job_},
          {"stage", std::to_string(stage_)},
          {"replica", std::to_string(replica_)}};
}

void StageMetrics::SetDataPlane(const std::string& plane) {
  std::lock_guard<std::mutex> lock(mu_);
  if (data_plane_ != nullptr) data_plane_family_->Remove(data_plane_);
  prometheus::Labels labels = Labels();
  labels["plane"] = plane;
  data_plane_ = &data_plane_family_->Add(labels);
  data_plane_->Set(1);
}

void StageMetrics::SetPredictedBubble(double ratio) {
  std::lock_guard<std::mutex> lock(mu_);
  if (predicted_ == nullptr) predicted_ = &predicted_family_->Add(Labels());
  predicted_->Set(ratio);
}

PipelineMetrics::PipelineMetrics(prometheus::Registry& registry,
                                 size_t keep_finished, Clock::duration linger)
    : registry_(registry),
      keep_(keep_finished),
      linger_(linger),
      busy_(prometheus::BuildCounter()
                .Name("gpipe_stage_busy_seconds_total")
                .Help("Seconds the stage spent computing, by phase")
                .Register(registry)),
      bubble_(prometheus::BuildCounter()
                  .Name("gpipe_stage_bubble_seconds_total")
                  .Help("Seconds of the stage's steps not spent computing "
                        "(step wall time minus busy time; with several "
                        "stages on one worker, minus all their busy time)")
                  .Register(registry)),
      utilization_(prometheus::BuildGauge()
                       .Name("gpipe_stage_utilization_ratio")
                       .Help("Busy share of the stage's last step (with "
                             "several stages on one worker, the worker's: "
                             "all their busy time)")
                       .Register(registry)),
      bubble_ratio_(prometheus::BuildGauge()
                        .Name("gpipe_stage_bubble_ratio")
                        .Help("Bubble share of the stage's last step")
                        .Register(registry)),
      theoretical_(prometheus::BuildGauge()
                       .Name("gpipe_pipeline_bubble_theoretical_ratio")
                       .Help("Bubble share of a balanced pipeline with the "
                             "job's K, M and schedule, M being each "
                             "replica's micro-batches (M/R of R replicas): "
                             "(K-1)/(M+K-1) for GPipe and 1F1B, "
                             "(K-1)/(3M+K-1) for ZB-H1, (K-1)/(vM+K-1) for "
                             "interleaved 1F1B over K workers, about "
                             "(K-1)/(6M+K-1) for ZB-V")
                       .Register(registry)),
      predicted_(prometheus::BuildGauge()
                     .Name("gpipe_stage_bubble_predicted_ratio")
                     .Help("Bubble share the cut the job runs explains for "
                           "the stage's worker: the schedule simulated on "
                           "the stages' measured layer times (the cost "
                           "model's until they are in), beyond the theory "
                           "where the cut's stages are unequal (absent "
                           "where the cut cannot be simulated)")
                     .Register(registry)),
      micro_batch_(prometheus::BuildHistogram()
                       .Name("gpipe_microbatch_duration_seconds")
                       .Help("Duration of one micro-batch op, by phase")
                       .Register(registry)),
      sent_(prometheus::BuildCounter()
                .Name("gpipe_transport_sent_bytes_total")
                .Help("Tensor bytes sent to neighbouring stages")
                .Register(registry)),
      received_(prometheus::BuildCounter()
                    .Name("gpipe_transport_received_bytes_total")
                    .Help("Tensor bytes received from neighbouring stages")
                    .Register(registry)),
      send_duration_(prometheus::BuildHistogram()
                         .Name("gpipe_transport_send_duration_seconds")
                         .Help("Time one send to a neighbour took")
                         .Register(registry)),
      activation_(prometheus::BuildGauge()
                      .Name("gpipe_stage_activation_memory_bytes")
                      .Help("Peak bytes of activations the stage held in a "
                            "step, over its assignment")
                      .Register(registry)),
      step_duration_(prometheus::BuildHistogram()
                         .Name("gpipe_step_duration_seconds")
                         .Help("Wall time of one training step on the stage")
                         .Register(registry)),
      samples_(prometheus::BuildCounter()
                   .Name("gpipe_samples_total")
                   .Help("Training samples the stage processed")
                   .Register(registry)),
      loss_(prometheus::BuildGauge()
                .Name("gpipe_loss")
                .Help("Training loss of the last step (last stage); with "
                      "replicas, this replica's micro-batches' share of it "
                      "(the replicas' values add up to the step's loss)")
                .Register(registry)),
      step_(prometheus::BuildGauge()
                .Name("gpipe_job_step")
                .Help("Training steps the job has completed")
                .Register(registry)),
      allreduce_seconds_(prometheus::BuildCounter()
                             .Name("gpipe_stage_allreduce_seconds_total")
                             .Help("Seconds the stage spent summing its "
                                   "gradients with the stage's other replicas "
                                   "(on a thread of their own while they "
                                   "overlap the last backward)")
                             .Register(registry)),
      allreduce_bytes_(prometheus::BuildCounter()
                           .Name("gpipe_stage_allreduce_bytes_total")
                           .Help("Gradient bytes the stage sent to and "
                                 "received from the stage's other replicas")
                           .Register(registry)),
      data_plane_(prometheus::BuildGauge()
                      .Name("gpipe_transport_data_plane")
                      .Help("1 for the data plane (grpc, shm, cuda_ipc, or "
                            "in_process between chunks of one worker) that "
                            "carries tensors from this stage to the next")
                      .Register(registry)) {}

std::shared_ptr<StageMetrics> PipelineMetrics::ForStage(
    const std::string& job, int64_t stage, int64_t replica, int64_t stages,
    int64_t micro_batches, bool last, ScheduleKind schedule,
    int64_t virtual_stages) {
  std::lock_guard<std::mutex> lock(mu_);
  const Key key(job, stage, replica);
  // A stage reassigned after an elastic change may run another K.
  const int64_t v = std::max<int64_t>(1, virtual_stages);
  const double theory =
      TheoreticalBubbleRatio(stages / v, micro_batches, schedule, v);
  if (auto it = live_.find(key); it != live_.end()) {
    it->second->theoretical_->Set(theory);
    return it->second;
  }
  for (auto it = finished_.begin(); it != finished_.end(); ++it) {
    if (it->metrics->job() == job && it->metrics->stage() == stage &&
        it->metrics->replica() == replica) {
      std::shared_ptr<StageMetrics> m = it->metrics;
      finished_.erase(it);
      m->theoretical_->Set(theory);
      live_[key] = m;
      return m;
    }
  }
  auto m = std::shared_ptr<StageMetrics>(new StageMetrics(job, stage, replica));
  m->data_plane_family_ = &data_plane_;
  m->predicted_family_ = &predicted_;
  const prometheus::Labels labels = m->Labels();
  for (Phase phase : kPhases) {
    prometheus::Labels with_phase = labels;
    with_phase["phase"] = std::string(PhaseName(phase));
    const int i = static_cast<int>(phase);
    m->busy_[i] = &busy_.Add(with_phase);
    if (phase != Phase::kOptimizer)
      m->micro_batch_[i] = &micro_batch_.Add(with_phase, MicroBatchBuckets());
  }
  m->bubble_ = &bubble_.Add(labels);
  m->utilization_ = &utilization_.Add(labels);
  m->bubble_ratio_ = &bubble_ratio_.Add(labels);
  m->theoretical_ = &theoretical_.Add(labels);
  m->theoretical_->Set(theory);
  m->sent_ = &sent_.Add(labels);
  m->received_ = &received_.Add(labels);
  m->send_duration_ = &send_duration_.Add(labels, SendBuckets());
  m->activation_ = &activation_.Add(labels);
  m->step_duration_ = &step_duration_.Add(labels, StepBuckets());
  m->samples_ = &samples_.Add(labels);
  if (last) m->loss_ = &loss_.Add(labels);
  m->step_ = &step_.Add(labels);
  m->allreduce_seconds_ = &allreduce_seconds_.Add(labels);
  m->allreduce_bytes_ = &allreduce_bytes_.Add(labels);
  live_[key] = m;
  return m;
}

void PipelineMetrics::Finish(const std::string& job, int64_t stage,
                             int64_t replica, bool completed) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(Key(job, stage, replica));
  if (it == live_.end()) return;
  if (!completed) {
    RemoveLocked(it->second);
    live_.erase(it);
    return;
  }
  finished_.push_back({it->second, Clock::now()});
  live_.erase(it);
  while (finished_.size() > keep_) {
    RemoveLocked(finished_.front().metrics);
    finished_.pop_front();
  }
}

void PipelineMetrics::KeepOnly(
    const std::string& job,
    const std::vector<std::pair<int64_t, int64_t>>& kept) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto other = [&](const StageMetrics& m) {
    return m.job() == job &&
           std::find(kept.begin(), kept.end(),
                     std::make_pair(m.stage(), m.replica())) == kept.end();
  };
  // Each series set that goes leaves the registry as it leaves its list.
  const auto gone = [&](const std::shared_ptr<StageMetrics>& m) {
    if (!other(*m)) return false;
    RemoveLocked(m);
    return true;
  };
  std::erase_if(live_, [&](const auto& entry) { return gone(entry.second); });
  std::erase_if(finished_,
                [&](const auto& entry) { return gone(entry.metrics); });
}

void PipelineMetrics::Prune(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!finished_.empty() && now - finished_.front().at >= linger_) {
    RemoveLocked(finished_.front().metrics);
    finished_.pop_front();
  }
}

std::vector<prometheus::MetricFamily> PipelineMetrics::Collect() const {
  // Pruning changes which series exist, not what a series says: the const
  // is about the scrape.
  const_cast<PipelineMetrics*>(this)->Prune();
  return registry_.Collect();
}

void PipelineMetrics::RemoveLocked(const std::shared_ptr<StageMetrics>& m) {
  for (int i = 0; i < kPhaseCount; ++i) {
    busy_.Remove(m->busy_[i]);
    if (m->micro_batch_[i] != nullptr) micro_batch_.Remove(m->micro_batch_[i]);
  }
  bubble_.Remove(m->bubble_);
  utilization_.Remove(m->utilization_);
  bubble_ratio_.Remove(m->bubble_ratio_);
  theoretical_.Remove(m->theoretical_);
  sent_.Remove(m->sent_);
  received_.Remove(m->received_);
  send_duration_.Remove(m->send_duration_);
  activation_.Remove(m->activation_);
  step_duration_.Remove(m->step_duration_);
  samples_.Remove(m->samples_);
  if (m->loss_ != nullptr) loss_.Remove(m->loss_);
  step_.Remove(m->step_);
  allreduce_seconds_.Remove(m->allreduce_seconds_);
  allreduce_bytes_.Remove(m->allreduce_bytes_);
  {
    std::lock_guard<std::mutex> lock(m->mu_);
    if (m->data_plane_ != nullptr) data_plane_.Remove(m->data_plane_);
    m->data_plane_ = nullptr;
    if (m->predicted_ != nullptr) predicted_.Remove(m->predicted_);
    m->predicted_ = nullptr;
  }
}

size_t PipelineMetrics::exported() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size() + finished_.size();
}

}  // namespace gpipe
