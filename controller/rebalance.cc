#include "controller/rebalance.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/balancer.h"
#include "controller/job_status.h"
#include "controller/placement.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/measured_cut.h"
#include "services/pipeline/partitioner.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"

namespace gpipe::controller {
namespace {

namespace v1 = gpipe::v1;

// The first step reports of an epoch include its start (connecting links,
// first allocations): the running step time begins after them.
constexpr int64_t kStartupReports = 2;
// Newest report's weight in the running step time (about the last ten).
constexpr double kNewest = 0.2;
// Reports with layer times each stage must have sent this epoch before its
// estimates are trusted, and step reports a new cut runs before its step
// time is called measured.
constexpr int64_t kMinTimedReports = 5;
constexpr int64_t kMeasureReports = 10;
// What a restart costs besides the replayed steps (assignment, links,
// model building, restoring the checkpoint): about a second on a small
// model (the recovery bench's figures), a few steps on a large one.
constexpr double kRestartSeconds = 1.0;
constexpr int64_t kRestartSteps = 5;
// A re-partition whose cut measures this much slower than the one before
// is undone at the next checkpoint.
constexpr double kWorseBy = 0.03;
constexpr std::string_view kRevert = "revert";

const ModelShapes* Shapes(JobRecord& job) {
  if (job.model_shapes == nullptr) {
    absl::StatusOr<ModelShapes> shapes =
        InferModelShapes(job.job.spec().model());
    if (!shapes.ok()) return nullptr;
    job.model_shapes = std::make_shared<const ModelShapes>(*std::move(shapes));
  }
  return job.model_shapes.get();
}

// A time a stage can have measured: no layer or step takes a day, and a
// larger figure (or a NaN) would only poison the estimates' sums.
constexpr double kMaxSeconds = 86400;
bool PlausibleSeconds(double x) { return x >= 0 && x <= kMaxSeconds; }

// The running cut and its workers, from the epoch's stages.
void RunningCut(const v1::JobStatus& status, std::vector<int64_t>* balance,
                std::vector<std::string>* workers) {
  for (const v1::StageStatus& st : status.stages()) {
    balance->push_back(st.layer_end() - st.layer_begin());
    workers->push_back(st.worker_id());
  }
}

// The micro-batches each replica's pipeline runs a step.
int64_t ReplicaMicroBatches(const JobRecord& job) {
  return std::max<int64_t>(
      1, MicroBatchCount(job.job.spec()) / std::max<int64_t>(1, job.replicas));
}

RebalanceInput Input(const JobRecord& job) {
  const v1::JobSpec& spec = job.job.spec();
  RebalanceInput in;
  in.shapes = job.model_shapes.get();
  // Each replica's pipeline runs its share: R = 2 of M = 4 is the bubble
  // of two micro-batches, not four.
  in.micro_batches = ReplicaMicroBatches(job);
  const int64_t m = MicroBatchCount(spec);
  in.micro_batch_size = (spec.batch_size() + m - 1) / m;
  in.schedule = ScheduleFromSpec(spec.pipeline().schedule());
  in.virtual_stages = VirtualStageCount(spec);
  in.remat = RematFromSpec(spec.pipeline().remat());
  RunningCut(job.status(), &in.balance, &in.workers);
  in.costs = EstimateCosts(job.layer_costs,
                           LayerClasses(spec.model(), *job.model_shapes));
  in.min_gain = RebalanceSettingsOf(spec).min_gain;
  in.measured_step_seconds = job.step_seconds;
  in.tried = job.tried_cuts;
  // The cuts of earlier re-partitions too: the status survives a
  // controller restart, the in-memory set does not.
  for (const v1::Repartition& r : job.status().repartitions()) {
    in.tried.insert(CutKey({r.old_balance().begin(), r.old_balance().end()},
                           {r.old_workers().begin(), r.old_workers().end()}));
    in.tried.insert(CutKey({r.new_balance().begin(), r.new_balance().end()},
                           {r.workers().begin(), r.workers().end()}));
  }
  return in;
}

// A measured re-partition (not itself a revert) whose cut runs more than
// kWorseBy slower than the one before, and which knows where it came from.
bool SlowerThanBefore(const v1::Repartition& r) {
  return r.reason() != kRevert && r.measured_new_seconds() > 0 &&
         r.measured_new_seconds() > r.measured_old_seconds() * (1 + kWorseBy) &&
         r.old_workers_size() == r.old_balance_size();
}

// Folds one report's times of stage `index` (`seconds`: its layers', per
// micro-batch; `update`: once a step) into the stage's running cost.
void RecordStageCost(JobRecord& job, int64_t index,
                     const v1::StageStatus& stage,
                     const std::vector<LayerSeconds>& seconds, double update) {
  if (index < 0 || index >= static_cast<int64_t>(job.stage_costs.size()))
    return;
  const v1::JobSpec& spec = job.job.spec();
  const ModelShapes* shapes = job.model_shapes.get();
  StageCost c;
  for (size_t i = 0; i < seconds.size(); ++i) {
    c.forward_seconds += seconds[i].forward;
    c.backward_seconds += seconds[i].backward;
    const int64_t l = stage.layer_begin() + static_cast<int64_t>(i);
    if (shapes != nullptr && l < static_cast<int64_t>(shapes->costs.size())) {
      c.weight_seconds += WeightHalfSeconds(
          shapes->costs[l], seconds[i].forward, seconds[i].backward);
    }
  }
  // The bubble's simulation re-materializes nothing: the recompute goes
  // into the backward here.
  if (StageRematerializes(RematFromSpec(spec.pipeline().remat()), index,
                          static_cast<int64_t>(job.stage_costs.size()))) {
    c.backward_seconds += c.forward_seconds;
  }
  c.update_seconds = update;
  std::optional<StageCost>& running = job.stage_costs[index];
  if (!running) {
    running = c;
    return;
  }
  const auto fold = [](double& old, double now) {
    old += kNewest * (now - old);
  };
  fold(running->forward_seconds, c.forward_seconds);
  fold(running->backward_seconds, c.backward_seconds);
  fold(running->weight_seconds, c.weight_seconds);
  fold(running->update_seconds, c.update_seconds);
}

std::string Millis(double seconds) {
  return absl::StrFormat("%.1f ms", seconds * 1e3);
}

}  // namespace

bool RecordStageTimes(JobRecord& job, const std::string& worker,
                      double probe_gflops, const v1::StepProgress& p) {
  const v1::JobStatus& status = job.status();
  const ModelShapes* shapes = Shapes(job);
  const v1::StageStatus* stage = nullptr;
  for (const v1::StageStatus& st : status.stages()) {
    if (st.stage() == p.stage()) stage = &st;
  }
  if (stage == nullptr || p.stage() < 0 ||
      p.stage() >= static_cast<int64_t>(job.timed_reports.size())) {
    return true;
  }
  if (p.stage() == status.stages_size() - 1 && p.step_seconds() > 0 &&
      PlausibleSeconds(p.step_seconds()) &&
      ++job.step_reports > kStartupReports) {
    job.step_seconds = job.step_reports == kStartupReports + 1
                           ? p.step_seconds()
                           : job.step_seconds + kNewest * (p.step_seconds() -
                                                           job.step_seconds);
  }
  const int64_t layers = stage->layer_end() - stage->layer_begin();
  const int n = static_cast<int>(layers);
  if (!PlausibleSeconds(p.update_seconds())) return false;
  const double update = p.update_seconds();
  std::vector<LayerSeconds> seconds;
  if (p.layer_forward_seconds_size() == n &&
      p.layer_backward_seconds_size() == n) {
    for (int i = 0; i < n; ++i) {
      const double f = p.layer_forward_seconds(i),
                   b = p.layer_backward_seconds(i);
      if (!PlausibleSeconds(f) || !PlausibleSeconds(b)) return false;
      seconds.push_back({f, b});
    }
  } else if (p.layer_forward_seconds_size() == 0 &&
             p.layer_backward_seconds_size() == 0) {
    // A CPU worker (it has a probe) times its layers from its second step
    // on: its first report is a warm-up, not a GPU stage's busy time.
    if (probe_gflops > 0 || shapes == nullptr || !(p.busy_seconds() > 0) ||
        !PlausibleSeconds(p.busy_seconds())) {
      return true;
    }
    const std::vector<double> all = CostModelLayerCosts(*shapes);
    const std::vector<double> mine(all.begin() + stage->layer_begin(),
                                   all.begin() + stage->layer_end());
    const v1::JobSpec& spec = job.job.spec();
    // The update is once a step, not per micro-batch: split apart.
    seconds = LayerSecondsFromBusy(
        std::max(0.0, p.busy_seconds() - update), ReplicaMicroBatches(job),
        StageRematerializes(RematFromSpec(spec.pipeline().remat()), p.stage(),
                            status.stages_size()),
        mine);
  } else {
    return false;
  }
  RecordStageCost(job, p.stage(), *stage, seconds, update);
  if (shapes != nullptr &&
      stage->layer_end() <= static_cast<int64_t>(shapes->costs.size())) {
    std::vector<int64_t> param_bytes;
    for (int64_t l = stage->layer_begin(); l < stage->layer_end(); ++l)
      param_bytes.push_back(shapes->costs[l].param_bytes);
    AddUpdateSeconds(update, param_bytes, seconds);
  }
  job.layer_costs.Record(worker, stage->layer_begin(), seconds, probe_gflops);
  ++job.timed_reports[p.stage()];
  return true;
}

std::optional<v1::Repartition> PlanRepartition(
    JobRecord& job, int64_t step,
    const std::function<int64_t(const std::string& worker)>& memory_of,
    absl::Time now, std::string* why) {
  const v1::JobSpec& spec = job.job.spec();
  const RebalanceSettings settings = RebalanceSettingsOf(spec);
  const v1::JobStatus& status = job.status();
  // What the previous checkpoint proposed, if anything: a move needs the
  // estimates of two checkpoints in a row to predict it gains enough, so
  // one noisy estimate moves nothing. They need not agree on the best cut:
  // a slow worker often has several cuts within a few percent of each
  // other, and noise picks a different one each time.
  const std::vector<int64_t> proposed_balance =
      std::exchange(job.proposed_balance, {});
  const std::vector<std::string> proposed_workers =
      std::exchange(job.proposed_workers, {});
  const std::string proposed_reason = std::exchange(job.proposed_reason, "");
  // An interleaved schedule's chunks are cut for their workers together
  // (stage i on worker i % K): the balancer, which gives each stage a
  // worker of its own, has nothing to propose for them.
  if (VirtualStageCount(spec) > 1) return std::nullopt;
  if (job.revert_pending && !status.repartitions().empty() &&
      status.stages_size() == job.stages) {
    // Back to the cut and workers before the last re-partition, whatever
    // the estimates say: they were wrong about it.
    const v1::Repartition& last = *status.repartitions().rbegin();
    v1::Repartition r;
    r.set_step(step);
    *r.mutable_time() = ToTimestamp(now);
    std::vector<int64_t> balance;
    std::vector<std::string> workers;
    RunningCut(status, &balance, &workers);
    for (int64_t b : balance) r.add_old_balance(b);
    for (const std::string& w : workers) r.add_old_workers(w);
    *r.mutable_new_balance() = last.old_balance();
    *r.mutable_workers() = last.old_workers();
    r.set_reason(std::string(kRevert));
    r.set_measured_old_seconds(job.step_seconds);
    return r;
  }
  // Replicas keep the cut they started with (their gradient sums are per
  // stage: every replica would have to move at once).
  if (!settings.enabled || job.stages < 2 || ReplicaCount(job.job.spec()) > 1 ||
      status.stages_size() != job.stages || step < settings.after_steps ||
      job.model_shapes == nullptr ||
      job.step_reports < kStartupReports + kMinTimedReports) {
    return std::nullopt;
  }
  if (!status.repartitions().empty() &&
      step - status.repartitions().rbegin()->step() < settings.every_steps) {
    return std::nullopt;
  }
  for (size_t i = 0; i < job.timed_reports.size(); ++i) {
    if (job.timed_reports[i] < kMinTimedReports) {
      *why = absl::StrCat("stage ", i, " has sent its layer times ",
                          job.timed_reports[i], " times this epoch (",
                          kMinTimedReports, " needed)");
      return std::nullopt;
    }
  }
  RebalanceInput in = Input(job);
  in.fits = [&](const std::vector<int64_t>& balance,
                const std::vector<std::string>& workers) {
    absl::StatusOr<StagePlan> plan =
        PlanStages(spec, static_cast<int64_t>(balance.size()), balance);
    if (!plan.ok()) return false;
    std::vector<int64_t> memory;
    for (const std::string& w : workers) memory.push_back(memory_of(w));
    return StagesFit(*plan, memory);
  };
  const std::optional<RebalanceProposal> proposal = ProposeRebalance(in, why);
  if (!proposal) return std::nullopt;
  // It pays when the steps left, each faster by the expected fraction,
  // save more than the steps replayed from the checkpoint and the restart.
  const double cost =
      job.step_seconds * static_cast<double>(status.step() - step) +
      std::max(kRestartSeconds,
               job.step_seconds * static_cast<double>(kRestartSteps));
  const auto saved_by = [&](double gain) {
    return gain * job.step_seconds *
           static_cast<double>(status.total_steps() - status.step());
  };
  const double gain =
      ExpectedGain(proposal->predicted_old_seconds,
                   proposal->predicted_new_seconds, job.step_seconds);
  const std::string cut = CutKey(proposal->balance, proposal->workers);
  if (saved_by(gain) <= cost) {
    *why = absl::StrFormat(
        "the %d steps left would save %.1f s at the cut %s, less than the "
        "%.1f s a restart from step %d costs",
        status.total_steps() - status.step(), saved_by(gain), cut, cost, step);
    return std::nullopt;
  }
  const auto propose = [&](std::string reason) {
    job.proposed_balance = proposal->balance;
    job.proposed_workers = proposal->workers;
    job.proposed_reason = proposal->reason;
    *why = absl::StrFormat(
        "%sthe cut %s would gain %.1f%%; the job moves if the next "
        "checkpoint's estimates agree that a move gains %.0f%% or more",
        reason, cut, 100 * gain, 100 * in.min_gain);
    return std::nullopt;
  };
  if (proposed_balance.empty()) return propose("");
  // The cut the previous checkpoint proposed, judged by this one's
  // estimates: the job moves there when they predict it gains enough as
  // well (a cut both estimates back, rather than this one's best alone).
  RebalanceProposal chosen = *proposal;
  const std::string previous = CutKey(proposed_balance, proposed_workers);
  if (previous != cut) {
    const double seconds =
        PredictStepSeconds(in, proposed_balance, proposed_workers);
    const double previous_gain = ExpectedGain(proposal->predicted_old_seconds,
                                              seconds, job.step_seconds);
    if (previous_gain < in.min_gain || saved_by(previous_gain) <= cost ||
        in.tried.contains(previous) ||
        (in.fits && !in.fits(proposed_balance, proposed_workers))) {
      return propose(absl::StrFormat(
          "the cut %s proposed at the last checkpoint would gain %.1f%% by "
          "these estimates; ",
          previous, 100 * previous_gain));
    }
    chosen.balance = proposed_balance;
    chosen.workers = proposed_workers;
    chosen.reason = proposed_reason;
    chosen.predicted_new_seconds = seconds;
  }

  v1::Repartition r;
  r.set_step(step);
  *r.mutable_time() = ToTimestamp(now);
  for (int64_t b : in.balance) r.add_old_balance(b);
  for (int64_t b : chosen.balance) r.add_new_balance(b);
  for (const std::string& w : chosen.workers) r.add_workers(w);
  for (const std::string& w : in.workers) r.add_old_workers(w);
  r.set_reason(chosen.reason);
  r.set_predicted_old_seconds(chosen.predicted_old_seconds);
  r.set_predicted_new_seconds(chosen.predicted_new_seconds);
  r.set_measured_old_seconds(job.step_seconds);
  return r;
}

std::optional<std::string> MeasureRepartition(JobRecord& job) {
  v1::JobStatus& status = job.status();
  if (!job.measuring_repartition || status.repartitions().empty() ||
      job.step_reports < kStartupReports + kMeasureReports) {
    return std::nullopt;
  }
  v1::Repartition& r = *status.mutable_repartitions()->rbegin();
  std::vector<int64_t> balance;
  std::vector<std::string> workers;
  RunningCut(status, &balance, &workers);
  if (!std::equal(balance.begin(), balance.end(), r.new_balance().begin(),
                  r.new_balance().end()) ||
      !std::equal(workers.begin(), workers.end(), r.workers().begin(),
                  r.workers().end())) {
    // Not the placement proposed (an elastic shrink, a chosen worker lost
    // meanwhile): nothing to measure it by.
    return std::nullopt;
  }
  job.measuring_repartition = false;
  r.set_measured_new_seconds(job.step_seconds);
  std::string message =
      absl::StrCat("re-partition at step ", r.step(), " (",
                   absl::StrJoin(r.old_balance(), ","), " -> ",
                   absl::StrJoin(r.new_balance(), ","), ") measured ",
                   Millis(r.measured_old_seconds()), " -> ",
                   Millis(r.measured_new_seconds()), " a step");
  if (r.reason() == kRevert) return message;
  absl::StrAppend(&message, " (expected ",
                  Millis(ExpectedStepSeconds(r.predicted_old_seconds(),
                                             r.predicted_new_seconds(),
                                             r.measured_old_seconds())),
                  ")");
  // Slower than before: the estimates were wrong (a noisy machine, a cost
  // they do not see). Undone once; the cut stays tried, so it is not
  // proposed again.
  if (SlowerThanBefore(r)) {
    job.revert_pending = true;
    absl::StrAppend(&message, ", slower: back to ",
                    absl::StrJoin(r.old_balance(), ","),
                    " at the next checkpoint");
  }
  return message;
}

void RecoverRebalanceState(JobRecord& job) {
  const auto& all = job.status().repartitions();
  if (all.empty()) return;
  const v1::Repartition& r = *all.rbegin();
  job.measuring_repartition = r.measured_new_seconds() <= 0;
  job.revert_pending = SlowerThanBefore(r);
}

CutPrediction PredictRunningCut(const JobRecord& job) {
  if (job.model_shapes == nullptr) return {};
  const RebalanceInput in = Input(job);
  if (!in.costs.complete || in.balance.empty()) return {};
  CutPrediction out;
  out.step_seconds = PredictStepSeconds(in, in.balance, in.workers);
  // The bubble from each stage's own times, as the stages ran them.
  std::vector<StageCost> stages;
  for (const std::optional<StageCost>& c : job.stage_costs) {
    if (!c) return out;
    stages.push_back(*c);
  }
  if (stages.size() != in.balance.size()) return out;
  const int64_t v =
      std::max<int64_t>(1, ChunksPerWorker(in.schedule, in.virtual_stages));
  out.bubbles =
      SimulatedBubbles(stages, in.schedule, in.micro_batches, v,
                       in.schedule == ScheduleKind::kZeroBubbleV
                           ? CostModelTicks(*in.shapes, in.balance, in.remat)
                           : std::vector<PhaseTicks>());
  return out;
}

}  // namespace gpipe::controller
