#include "services/telemetry/controller_metrics.h"

#include <utility>

namespace gpipe {
namespace {

prometheus::MetricFamily StateGauge(const std::string& name,
                                    const std::string& help,
                                    const std::map<std::string, int64_t>& by) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  for (const auto& [state, count] : by) {
    prometheus::ClientMetric m;
    m.label.push_back({"state", state});
    m.gauge.value = static_cast<double>(count);
    family.metric.push_back(std::move(m));
  }
  return family;
}

}  // namespace

void ControllerMetrics::SetCounts(std::function<ClusterCounts()> counts) {
  std::lock_guard<std::mutex> lock(mu_);
  counts_ = std::move(counts);
}

ControllerMetrics::ControllerMetrics() {
  restarts_ = &prometheus::BuildCounter()
                   .Name("gpipe_job_restarts_total")
                   .Help(
                       "Times a job went RESTARTING after losing a stage, "
                       "counted against its max_restarts")
                   .Register(registry_);
  checkpoint_failures_ =
      &prometheus::BuildCounter()
           .Name("gpipe_checkpoint_failures_total")
           .Help(
               "Checkpoints not taken: reason store_full (no space; the job "
               "waits), write (a stage's file) or commit (verifying the "
               "files or writing the manifest)")
           .Register(registry_);
  checkpoints_ = &prometheus::BuildCounter()
                      .Name("gpipe_checkpoints_total")
                      .Help("Checkpoints committed (manifest written)")
                      .Register(registry_)
                      .Add({});
  failed_ = &prometheus::BuildCounter()
                 .Name("gpipe_jobs_failed_total")
                 .Help(
                     "Jobs that ended FAILED (restarts used up, a loss that "
                     "is not finite, data or weights that cannot be used, "
                     "...): gpipectl status JOB says why")
                 .Register(registry_)
                 .Add({});
  corrupt_ = &prometheus::BuildCounter()
                  .Name("gpipe_checkpoints_corrupt_total")
                  .Help(
                      "Committed checkpoints found corrupt or truncated "
                      "(DATA_LOSS) and passed over for an older one")
                  .Register(registry_)
                  .Add({});
  store_failures_ =
      &prometheus::BuildCounter()
           .Name("gpipe_job_store_failures_total")
           .Help(
               "Writes of the job store (--store) that failed, a full disk "
               "most likely: retried every 2 s, but a controller restarted "
               "meanwhile replays the jobs from what was last written")
           .Register(registry_)
           .Add({});
  recovery_ =
      &prometheus::BuildHistogram()
           .Name("gpipe_recovery_duration_seconds")
           .Help("Time from losing a stage to the job running again")
           .Register(registry_)
           .Add({}, prometheus::Histogram::BucketBoundaries{
                        0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600});
  eval_loss_ = &prometheus::BuildGauge()
                    .Name("gpipe_eval_loss")
                    .Help(
                        "Mean loss on the test split at the job's newest "
                        "evaluation (every eval.every steps and at the end)")
                    .Register(registry_);
  eval_accuracy_ = &prometheus::BuildGauge()
                        .Name("gpipe_eval_accuracy")
                        .Help(
                            "Accuracy on the test split at the job's newest "
                            "evaluation")
                        .Register(registry_);
  repartitions_ = &prometheus::BuildCounter()
                       .Name("gpipe_job_repartitions_total")
                       .Help(
                           "Re-partitions by the self-balancing pipeline: "
                           "layer_costs (layers cost other than the cut "
                           "assumed), worker_speeds (workers differ) or "
                           "revert (back from a cut that measured slower)")
                       .Register(registry_);
  // Both reasons from the start, so a dashboard's rate is 0, not absent.
  repartitions_->Add({{"reason", "layer_costs"}});
  repartitions_->Add({{"reason", "worker_speeds"}});
  repartitions_->Add({{"reason", "revert"}});
  step_seconds_ = &prometheus::BuildGauge()
                       .Name("gpipe_job_step_seconds")
                       .Help(
                           "A job's step time as its last stage measures it "
                           "(a running estimate over the last steps)")
                       .Register(registry_);
  predicted_step_seconds_ =
      &prometheus::BuildGauge()
           .Name("gpipe_job_predicted_step_seconds")
           .Help(
               "The simulator's step time for the job's running cut from "
               "its measured layer and worker speeds (compute only: the gap "
               "to gpipe_job_step_seconds is transfers and fixed costs)")
           .Register(registry_);
  loss_ = &prometheus::BuildGauge()
               .Name("gpipe_job_loss")
               .Help(
                   "A job's training loss of its newest step, over every "
                   "replica's micro-batches (gpipe_loss is one last "
                   "stage's share)")
               .Register(registry_);
}

void ControllerMetrics::ObserveLoss(const std::string& job, double loss) {
  loss_->Add({{"job", job}}).Set(loss);
}

namespace {
constexpr const char* kCheckpointFailureReasons[] = {"store_full", "write",
                                                     "commit"};
}  // namespace

void ControllerMetrics::OnJob(const std::string& job) {
  restarts_->Add({{"job", job}});
  for (const char* reason : kCheckpointFailureReasons) {
    checkpoint_failures_->Add({{"job", job}, {"reason", reason}});
  }
}

void ControllerMetrics::OnRestart(const std::string& job) {
  restarts_->Add({{"job", job}}).Increment();
}

void ControllerMetrics::OnCheckpointFailure(const std::string& job,
                                            const std::string& reason) {
  checkpoint_failures_->Add({{"job", job}, {"reason", reason}}).Increment();
}

namespace {
// Removes the series of `labels` from `family` where it has one.
template <typename T>
void DropSeries(prometheus::Family<T>* family,
                const std::map<std::string, std::string>& labels) {
  if (family->Has(labels)) family->Remove(&family->Add(labels));
}
}  // namespace

void ControllerMetrics::OnJobEnded(const std::string& job) {
  for (prometheus::Family<prometheus::Gauge>* family :
       {step_seconds_, predicted_step_seconds_}) {
    DropSeries(family, {{"job", job}});
  }
}

void ControllerMetrics::ForgetJob(const std::string& job) {
  OnJobEnded(job);
  for (prometheus::Family<prometheus::Gauge>* family :
       {eval_loss_, eval_accuracy_, loss_}) {
    DropSeries(family, {{"job", job}});
  }
  DropSeries(restarts_, {{"job", job}});
  for (const char* reason : kCheckpointFailureReasons) {
    DropSeries(checkpoint_failures_, {{"job", job}, {"reason", reason}});
  }
}

void ControllerMetrics::OnRepartition(const std::string& reason) {
  repartitions_->Add({{"reason", reason}}).Increment();
}

void ControllerMetrics::ObserveStepTime(const std::string& job, double measured,
                                        double predicted) {
  if (measured > 0) step_seconds_->Add({{"job", job}}).Set(measured);
  if (predicted > 0)
    predicted_step_seconds_->Add({{"job", job}}).Set(predicted);
}

void ControllerMetrics::ObserveEvaluation(const std::string& job, double loss,
                                          double accuracy) {
  eval_loss_->Add({{"job", job}}).Set(loss);
  eval_accuracy_->Add({{"job", job}}).Set(accuracy);
}

std::vector<prometheus::MetricFamily> ControllerMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> families = registry_.Collect();
  ClusterCounts counts;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (counts_) counts = counts_();
  }
  families.push_back(StateGauge(
      "gpipe_jobs", "Jobs the controller knows, by state", counts.jobs));
  families.push_back(StateGauge("gpipe_workers",
                                "Workers attached to the controller, by state",
                                counts.workers));
  return families;
}

}  // namespace gpipe
