// The per-stage metric families of docs/design.md (Metrics), labelled by job,
// stage and replica only (replica "0" for a job of one pipeline). A worker
// holds one PipelineMetrics on its registry and one StageMetrics per
// assignment; each step's figures come from the stage timeline. Label sets of
// an ended assignment linger for a while (so their final values get scraped)
// and are then removed, and at most a few linger at once: a long-lived worker
// exports a bounded number of series however many jobs it runs, and a job that
// ended stops looking like a stalled one.
#ifndef GPIPE_SERVICES_TELEMETRY_STAGE_METRICS_H_
#define GPIPE_SERVICES_TELEMETRY_STAGE_METRICS_H_

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/pipeline/timeline.h"
#include "services/telemetry/step_figures.h"

namespace gpipe {

// What a stage knows about a step beyond its timeline.
struct StepOutcome {
  int64_t completed_steps = 0;  // the job's step counter after this step
  int64_t samples = 0;          // samples this step trained on
  int64_t peak_activation_bytes = 0;
  std::optional<double> loss;  // last stage only
  // A worker that runs several stages on one thread (an interleaved
  // schedule's chunks): the others' busy time in this step. The stage is
  // not idle while its thread computes for them, so that time is not its
  // bubble: its bubble, and so its utilization, are its worker's.
  double other_stages_busy_seconds = 0;
};

class PipelineMetrics;

// The series of one (job, stage). Thread-safe.
class StageMetrics {
 public:
  // Adds one step: busy time by phase, bubble, the last-step ratios, each
  // micro-batch op's duration, step duration, samples, loss, step counter.
  void ObserveStep(const StepTimeline& step, const StepOutcome& report);
  // The step the stage starts from (a restored checkpoint's, or 0): the
  // step gauge says it before the first step completes, where it read 0
  // while a restarted job restored step 250.
  void StartAt(int64_t step);
  // One message sent to a neighbour (tensor bytes, time Send took) or
  // received from one.
  void ObserveSend(int64_t bytes, double seconds);
  void ObserveReceive(int64_t bytes);
  // One step's gradient reduction across the stage's replicas: its seconds
  // and the gradient bytes this replica sent and received.
  void ObserveReduction(double seconds, int64_t bytes);
  // The data plane (services/transport/data_plane.h: "grpc", "shm", "cuda_ipc")
  // of the link to the next stage: gpipe_transport_data_plane{plane} is 1.
  void SetDataPlane(const std::string& plane);
  // The bubble share the job's cut explains for this stage's worker
  // (Assignment.predicted_bubble, the cost model's, then the controller's
  // from the measured times, CutBubble): gpipe_stage_bubble_predicted_ratio,
  // which the bubble alert reads beside the schedule's theory.
  void SetPredictedBubble(double ratio);

  const std::string& job() const { return job_; }
  int64_t stage() const { return stage_; }
  int64_t replica() const { return replica_; }

 private:
  friend class PipelineMetrics;
  StageMetrics(std::string job, int64_t stage, int64_t replica)
      : job_(std::move(job)), stage_(stage), replica_(replica) {}
  // Every series' job, stage and replica labels.
  prometheus::Labels Labels() const;

  std::string job_;
  int64_t stage_;
  int64_t replica_;
  std::array<prometheus::Counter*, kPhaseCount> busy_{};
  std::array<prometheus::Histogram*, kPhaseCount> micro_batch_{};
  prometheus::Counter* bubble_ = nullptr;
  prometheus::Gauge* utilization_ = nullptr;
  prometheus::Gauge* bubble_ratio_ = nullptr;
  prometheus::Gauge* theoretical_ = nullptr;
  prometheus::Counter* sent_ = nullptr;
  prometheus::Counter* received_ = nullptr;
  prometheus::Histogram* send_duration_ = nullptr;
  prometheus::Gauge* activation_ = nullptr;
  prometheus::Histogram* step_duration_ = nullptr;
  prometheus::Counter* samples_ = nullptr;
  prometheus::Gauge* loss_ = nullptr;  // last stage only
  prometheus::Gauge* step_ = nullptr;
  prometheus::Counter* allreduce_seconds_ = nullptr;
  prometheus::Counter* allreduce_bytes_ = nullptr;
  prometheus::Family<prometheus::Gauge>* data_plane_family_ = nullptr;
  prometheus::Gauge* data_plane_ = nullptr;  // under mu_
  prometheus::Family<prometheus::Gauge>* predicted_family_ = nullptr;
  prometheus::Gauge* predicted_ = nullptr;  // under mu_
  std::mutex mu_;
  int64_t peak_bytes_ = 0;
};

// Serve it (rather than its registry) so that lingering label sets are
// pruned on every scrape.
class PipelineMetrics : public prometheus::Collectable {
 public:
  using Clock = std::chrono::steady_clock;
  // Families are created on `registry` (not owned). Label sets of ended
  // assignments stay exported for `linger`, and at most `keep_finished` of
  // them.
  explicit PipelineMetrics(prometheus::Registry& registry,
                           size_t keep_finished = 4,
                           Clock::duration linger = std::chrono::seconds(60));

  // The series of (job, stage, replica), created on first use (a reassigned
  // stage of the same job continues its counters). `last` stages export the
  // loss. `stages` counts an interleaved schedule's chunks, `virtual_stages`
  // per worker.
  std::shared_ptr<StageMetrics> ForStage(
      const std::string& job, int64_t stage, int64_t replica, int64_t stages,
      int64_t micro_batches, bool last,
      ScheduleKind schedule = ScheduleKind::kGPipe, int64_t virtual_stages = 1);
  // The assignment of (job, stage, replica) ended and will not use its
  // StageMetrics again: its series stay for the linger time or until
  // `keep_finished` newer ones have ended, then go. A stage that failed or
  // was cancelled (`completed` false) runs again elsewhere, or its job
  // ended: its series go at once, since frozen beside the new worker's they
  // made two series of one stage, which broke `on(job, stage, replica)`
  // matches (and a stopped worker that woke exported a finished job's).
  void Finish(const std::string& job, int64_t stage, int64_t replica = 0,
              bool completed = true);

  // A new assignment of `job` runs `kept` (stage, replica) pairs on this
  // worker: the series of the job's other pairs go at once, live or
  // lingering. A re-partition that moved a stage to another worker left
  // its old series here, frozen, beside the new worker's: two series for
  // one stage, which broke `on(job, stage, replica)` matches.
  void KeepOnly(const std::string& job,
                const std::vector<std::pair<int64_t, int64_t>>& kept);

  // Removes the label sets that lingered long enough (as of `now`).
  void Prune(Clock::time_point now = Clock::now());
  // Label sets exported now (for tests of the bound).
  size_t exported() const;

  // Prunes, then collects the registry.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  using Key = std::tuple<std::string, int64_t, int64_t>;
  struct Finished {
    std::shared_ptr<StageMetrics> metrics;
    Clock::time_point at;
  };
  void RemoveLocked(const std::shared_ptr<StageMetrics>& m);

  prometheus::Registry& registry_;
  size_t keep_;
  Clock::duration linger_;
  prometheus::Family<prometheus::Counter>& busy_;
  prometheus::Family<prometheus::Counter>& bubble_;
  prometheus::Family<prometheus::Gauge>& utilization_;
  prometheus::Family<prometheus::Gauge>& bubble_ratio_;
  prometheus::Family<prometheus::Gauge>& theoretical_;
  prometheus::Family<prometheus::Gauge>& predicted_;
  prometheus::Family<prometheus::Histogram>& micro_batch_;
  prometheus::Family<prometheus::Counter>& sent_;
  prometheus::Family<prometheus::Counter>& received_;
  prometheus::Family<prometheus::Histogram>& send_duration_;
  prometheus::Family<prometheus::Gauge>& activation_;
  prometheus::Family<prometheus::Histogram>& step_duration_;
  prometheus::Family<prometheus::Counter>& samples_;
  prometheus::Family<prometheus::Gauge>& loss_;
  prometheus::Family<prometheus::Gauge>& step_;
  prometheus::Family<prometheus::Counter>& allreduce_seconds_;
  prometheus::Family<prometheus::Counter>& allreduce_bytes_;
  prometheus::Family<prometheus::Gauge>& data_plane_;
  mutable std::mutex mu_;
  std::map<Key, std::shared_ptr<StageMetrics>> live_;
  std::deque<Finished> finished_;  // oldest first
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_STAGE_METRICS_H_
