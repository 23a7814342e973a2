// The controller's metric families: jobs and workers by state (read from
// the controller at scrape time, so they are never stale), restarts,
// committed checkpoints and recovery durations (counted by whoever drives
// recovery). Every family is exported from the start, zeros included.
#ifndef GPIPE_SERVICES_TELEMETRY_CONTROLLER_METRICS_H_
#define GPIPE_SERVICES_TELEMETRY_CONTROLLER_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace gpipe {

// How many jobs and workers are in each state now. Every state the
// product knows should be a key (with 0), so a series never vanishes.
struct ClusterCounts {
  std::map<std::string, int64_t> jobs;     // PENDING, RUNNING, ...
  std::map<std::string, int64_t> workers;  // IDLE, BUSY
};

class ControllerMetrics : public prometheus::Collectable {
 public:
  ControllerMetrics();

  // `counts` is called on every scrape, from the exposer's thread, until it
  // is replaced; before it is set the state gauges are empty.
  void SetCounts(std::function<ClusterCounts()> counts);

  // Starts `job`'s counters at 0, so that the first restart or failed
  // checkpoint is an increase Prometheus sees (a series born at 1 is not).
  void OnJob(const std::string& job);
  void OnRestart(const std::string& job);
  void OnCheckpoint() { checkpoints_->Increment(); }
  // A job ended FAILED (its reason is on the job: gpipectl status).
  void OnJobFailed() { failed_->Increment(); }
  // A checkpoint of `job` that was not written or committed: reason
  // store_full (no space: the job waits it out), write (a stage could not
  // write or upload its file) or commit (the controller could not verify
  // the files or write the manifest).
  void OnCheckpointFailure(const std::string& job, const std::string& reason);
  void OnCorruptCheckpoints(int64_t n) { corrupt_->Increment(n); }
  // A write of the job store (--store) that failed: a full disk; it is
  // tried again, but a restart meanwhile would replay what it lost.
  void OnStoreFailure() { store_failures_->Increment(); }
  void ObserveRecovery(double seconds) { recovery_->Observe(seconds); }
  // The newest evaluation of `job` on the test split.
  void ObserveEvaluation(const std::string& job, double loss, double accuracy);
  // A re-partition by the balancer; reason layer_costs or worker_speeds.
  void OnRepartition(const std::string& reason);
  // The job's measured step time (a running estimate) and the simulator's
  // for its running cut (compute only); 0 leaves a gauge as it was.
  void ObserveStepTime(const std::string& job, double measured,
                       double predicted);
  // The job's training loss of its newest step, assembled from every
  // replica's micro-batches (what `gpipectl status` shows).
  void ObserveLoss(const std::string& job, double loss);
  // Drops the series that describe a running job (its step times): a
  // finished job's last step time stayed on the dashboards as if it ran.
  // Its loss, evaluation and counters stay until ForgetJob.
  void OnJobEnded(const std::string& job);
  // Drops every series of `job` (deleted, or past its retention): a deleted
  // job's loss stayed on the dashboards until the controller restarted.
  void ForgetJob(const std::string& job);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable std::mutex mu_;
  std::function<ClusterCounts()> counts_;  // guarded by mu_
  prometheus::Registry registry_;
  prometheus::Family<prometheus::Counter>* restarts_;
  prometheus::Family<prometheus::Counter>* checkpoint_failures_;
  prometheus::Counter* checkpoints_;
  prometheus::Counter* failed_;
  prometheus::Counter* corrupt_;
  prometheus::Counter* store_failures_;
  prometheus::Histogram* recovery_;
  prometheus::Family<prometheus::Gauge>* eval_loss_;
  prometheus::Family<prometheus::Gauge>* eval_accuracy_;
  prometheus::Family<prometheus::Counter>* repartitions_;
  prometheus::Family<prometheus::Gauge>* step_seconds_;
  prometheus::Family<prometheus::Gauge>* predicted_step_seconds_;
  prometheus::Family<prometheus::Gauge>* loss_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TELEMETRY_CONTROLLER_METRICS_H_
