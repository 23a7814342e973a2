#include "services/pipeline/in_process_pipeline.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/core/status.h"
#include "services/pipeline/content_check.h"
#include "services/pipeline/in_process_reduction.h"
#include "services/pipeline/init_weights.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/link_reduction.h"
#include "services/pipeline/partitioner.h"
#include "services/pipeline/simulator.h"
#include "services/pipeline/worker_step.h"
#include "services/transport/in_process_link.h"

namespace gpipe {

PipelineOptions OptionsFromSpec(const gpipe::v1::JobSpec& spec) {
  PipelineOptions o;
  o.stages = StageCount(spec);
  o.virtual_stages = VirtualStageCount(spec);
  o.micro_batches = MicroBatchCount(spec);
  o.replicas = ReplicaCount(spec);
  o.schedule = ScheduleFromSpec(spec.pipeline().schedule());
  o.remat = RematFromSpec(spec.pipeline().remat());
  return o;
}

absl::StatusOr<std::unique_ptr<InProcessPipeline>> InProcessPipeline::Create(
    const gpipe::v1::JobSpec& spec, const PipelineOptions& options) {
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  std::unique_ptr<InProcessPipeline> p(new InProcessPipeline());
  p->spec_ = spec;
  const int64_t workers =
      options.stages > 0 ? options.stages : StageCount(spec);
  const int64_t m =
      options.micro_batches > 0 ? options.micro_batches : MicroBatchCount(spec);
  const int64_t v =
      !Interleaves(options.schedule)
          ? 1
          : ChunksPerWorker(options.schedule,
                            options.virtual_stages > 0
                                ? options.virtual_stages
                                : spec.pipeline().virtual_stages());
  const int64_t layers = spec.model().layers_size();
  if (v > layers || workers > layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stages: ", workers, v > 1 ? absl::StrCat(" x ", v, " chunks") : "",
        " is more than the model's ", layers, " layers"));
  }
  if (!options.ops.empty() &&
      (v > 1 || static_cast<int64_t>(options.ops.size()) != workers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ops: ", options.ops.size(), " lists for ", workers,
                     " stages", v > 1 ? " of an interleaved pipeline" : ""));
  }
  if (const std::string shape =
          ScheduleShapeError(options.schedule, workers, m, v);
      !shape.empty()) {
    return absl::InvalidArgumentError(shape);
  }
  p->workers_ = workers;
  p->virtual_stages_ = v;
  p->schedule_ = options.schedule;
  p->remat_ = options.remat;
  const int64_t replicas =
      options.replicas > 0 ? options.replicas : ReplicaCount(spec);
  const int64_t groups = spec.pipeline().gradient_groups() > 0
                             ? spec.pipeline().gradient_groups()
                             : replicas;
  if (replicas > 1 || groups > 1) {
    // The spec's rules for replicas (groups dividing M, whole groups per
    // replica...) on the counts these options ask for.
    gpipe::v1::JobSpec asked = spec;
    asked.mutable_pipeline()->set_replicas(replicas);
    asked.mutable_pipeline()->set_micro_batches(m);
    asked.mutable_pipeline()->set_schedule(ScheduleToSpec(options.schedule));
    asked.mutable_pipeline()->set_virtual_stages(v);
    asked.mutable_pipeline()->set_stages(workers);
    asked.mutable_pipeline()->clear_balance();
    RETURN_IF_ERROR(ValidateJobSpec(asked));
  }
  if (replicas > 1 && !options.ops.empty()) {
    return absl::InvalidArgumentError("ops: given for one replica only");
  }
  p->replicas_ = replicas;
  // The stages: K of them, or K x v chunks with worker w holding w, w+K, ...
  const int64_t k = workers * v;
  p->chunks_ = k;
  if (k > layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stages: ", k,
        v > 1 ? absl::StrCat(" (", workers, " x ", v, " chunks)") : "",
        " is more than the model's ", layers, " layers"));
  }
  if (!options.balance.empty()) {
    p->balance_ = options.balance;
    if (static_cast<int64_t>(p->balance_.size()) != k ||
        std::accumulate(p->balance_.begin(), p->balance_.end(), int64_t{0}) !=
            layers ||
        *std::min_element(p->balance_.begin(), p->balance_.end()) < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "balance: [", absl::StrJoin(p->balance_, ", "), "] is not ", k,
          " positive layer counts adding up to ", layers));
    }
  } else {
    // Weighted by the remat mode these stages will run (a flag may differ
    // from the spec's).
    gpipe::v1::JobSpec for_k = spec;
    for_k.mutable_pipeline()->set_remat(RematToSpec(options.remat));
    // And by the schedule they will run (ZB-V balances its workers); a
    // spec's own balance keeps its meaning (for the spec's schedule).
    if (spec.pipeline().balance().empty()) {
      for_k.mutable_pipeline()->set_schedule(ScheduleToSpec(options.schedule));
      for_k.mutable_pipeline()->set_micro_batches(m);
    }
    ASSIGN_OR_RETURN(p->balance_, PartitionJobAt(for_k, k));
  }
  if (options.dataset != nullptr) {
    p->dataset_ = options.dataset;
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<Dataset> dataset, OpenJobDataset(spec));
    p->dataset_ = std::move(dataset);
  }

  // Each direction holds a whole step's messages, so a send never waits on
  // a neighbour that is itself waiting to send (no cycle of full queues).
  const size_t capacity = static_cast<size_t>(m) + 4;
  std::vector<Link*> up(k * replicas, nullptr), down(k * replicas, nullptr);
  for (int64_t r = 0; r < replicas; ++r) {
    for (int64_t i = r * k; i + 1 < (r + 1) * k; ++i) {
      auto [a, b] = MakeInProcessLinkPair(capacity);
      down[i] = a.get();
      up[i + 1] = b.get();
      p->links_.push_back(std::move(a));
      p->links_.push_back(std::move(b));
    }
  }
  // reducers_[i] (in memory) or reducers_[i * R + r] (over links).
  if (replicas > 1 && !options.reduce_over_links) {
    for (int64_t i = 0; i < k; ++i) {
      p->reducers_.push_back(
          std::make_unique<InProcessReduction>(replicas, groups));
    }
  } else if (replicas > 1) {
    std::vector<RowRange> shares;
    for (int64_t r = 0; r < replicas; ++r)
      shares.push_back(ReplicaGroups(groups, replicas, r));
    for (int64_t i = 0; i < k; ++i) {
      // peers[r][q]: replica r's end of its link to replica q.
      std::vector<std::vector<Link*>> peers(
          replicas, std::vector<Link*>(replicas, nullptr));
      for (int64_t a = 0; a < replicas; ++a) {
        for (int64_t b = a + 1; b < replicas; ++b) {
          auto [to_b, to_a] = MakeInProcessLinkPair(4);
          peers[a][b] = to_b.get();
          peers[b][a] = to_a.get();
          p->links_.push_back(std::move(to_b));
          p->links_.push_back(std::move(to_a));
        }
      }
      for (int64_t r = 0; r < replicas; ++r) {
        p->reducers_.push_back(
            std::make_unique<LinkReduction>(r, groups, shares, peers[r]));
      }
    }
  }
  const std::vector<int64_t> begins = StageBegins(p->balance_);
  const auto origin = Timeline::Clock::now();
  for (int64_t at = 0; at < k * replicas; ++at) {
    const int64_t i = at % k;
    const int64_t r = at / k;
    StagePlacement placement;
    placement.index = i;
    placement.count = k;
    placement.layer_begin = begins[i];
    placement.layer_end = begins[i] + p->balance_[i];
    placement.micro_batches = m;
    placement.schedule = options.schedule;
    if (v == 1 && static_cast<int64_t>(options.ops.size()) == k)
      placement.ops = options.ops[i];
    placement.remat = options.remat;
    placement.device = options.device;
    placement.gradient_groups = groups;
    const RowRange share = ReplicaMicroBatches(m, groups, replicas, r);
    placement.micro_batch_begin = share.begin;
    placement.micro_batch_end = share.end;
    placement.replica = r;
    if (replicas > 1) {
      placement.reducer =
          p->reducers_[options.reduce_over_links ? i * replicas + r : i].get();
    }
    const bool needs_data = i == 0 || i == k - 1;
    ASSIGN_OR_RETURN(
        std::unique_ptr<Stage> stage,
        Stage::Create(spec, placement, needs_data ? p->dataset_ : nullptr,
                      up[at], down[at], origin));
    p->stages_.push_back(std::move(stage));
    p->threads_.push_back(
        std::make_unique<StageThread>(std::max(1, options.threads_per_stage)));
  }
  if (v > 1) {
    // ZB-V orders its ops for the cost model's phase times, as the
    // controller has a cluster's workers do.
    if (options.schedule == ScheduleKind::kZeroBubbleV) {
      ASSIGN_OR_RETURN(const ModelShapes shapes,
                       InferModelShapes(spec.model()));
      p->order_ticks_ = CostModelTicks(shapes, p->balance_, options.remat);
    }
    std::vector<std::vector<Op>> all =
        MakeWorkerSchedules(options.schedule, workers, m, v, p->order_ticks_);
    for (int64_t w = 0; w < workers; ++w) {
      p->worker_ops_.push_back(
          WithTransfers(all[w], options.schedule, workers, v, w));
    }
  }
  if (spec.has_init_from()) {
    ASSIGN_OR_RETURN(const InitWeights weights,
                     ReadInitWeights(spec.init_from().path()));
    InitReport all;
    for (const auto& stage : p->stages_) {
      const StagePlacement& at = stage->placement();
      const bool counted = at.replica == 0;
      absl::StatusOr<InitReport> loaded = LoadInitWeights(
          weights, spec.init_from(), stage->model().StateTensors(),
          stage->optimizer().State(),
          LayerRange{at.layer_begin, at.layer_end, layers});
      if (!loaded.ok()) {
        // A stage's load names its own layers' tensors: the whole model's
        // check names every one that does not fit, as one process does.
        const absl::Status whole = CheckInitWeights(spec, weights);
        return whole.ok() ? loaded.status() : whole;
      }
      const InitReport& report = *loaded;
      if (!counted) continue;  // the same load again
      all.loaded += report.loaded;
      all.missing.insert(all.missing.end(), report.missing.begin(),
                         report.missing.end());
      all.ignored.insert(all.ignored.end(), report.ignored.begin(),
                         report.ignored.end());
    }
    p->init_summary_ = all.ToString();
    p->step_ = InitialStep(spec);
  }
  return p;
}

InProcessPipeline::~InProcessPipeline() {
  CloseAll();
  threads_.clear();  // joins after queued work ends
}

void InProcessPipeline::CloseAll() {
  for (auto& link : links_) link->Close();
  for (auto& reducer : reducers_) reducer->Close();
}

template <typename Result, typename Work>
absl::StatusOr<std::vector<Result>> InProcessPipeline::OnAllStages(
    Work work, bool all_replicas) {
  return OnThreads<Result>(all_replicas ? stages_.size() : chunks_,
                           [&](size_t i) { return work(*stages_[i]); });
}

template <typename Result, typename Work>
absl::StatusOr<std::vector<Result>> InProcessPipeline::OnThreads(size_t k,
                                                                 Work work) {
  if (broken_) {
    return absl::FailedPreconditionError(
        "the pipeline failed earlier; its links are closed");
  }
  std::vector<absl::StatusOr<Result>> results(k, absl::UnknownError("not run"));
  std::vector<std::future<void>> done;
  for (size_t i = 0; i < k; ++i) {
    done.push_back(threads_[i]->Post([this, i, &results, &work] {
      results[i] = work(i);
      if (!results[i].ok()) CloseAll();
    }));
  }
  for (auto& d : done) d.wait();
  // Report the error that caused the others (they only see closed links).
  std::vector<absl::Status> statuses;
  for (const auto& r : results) statuses.push_back(r.status());
  if (const absl::Status first = FirstCause(statuses); !first.ok()) {
    broken_ = true;
    return first;
  }
  std::vector<Result> out;
  for (auto& r : results) out.push_back(std::move(*r));
  return out;
}

absl::StatusOr<std::vector<StageStepResult>> InProcessPipeline::RunWorkerStep(
    int64_t w, int64_t step) {
  std::vector<Stage*> chunks;
  for (int64_t c = 0; c < virtual_stages_; ++c)
    chunks.push_back(stages_[StageOfChunk(schedule_, workers_, w, c)].get());
  return gpipe::RunWorkerStep(chunks, worker_ops_[w], step);
}

absl::StatusOr<StepReport> InProcessPipeline::Step() {
  const int64_t s = step_;
  std::vector<StageStepResult> results;
  if (virtual_stages_ > 1) {
    ASSIGN_OR_RETURN(
        std::vector<std::vector<StageStepResult>> by_worker,
        OnThreads<std::vector<StageStepResult>>(workers_, [&](size_t w) {
          return RunWorkerStep(static_cast<int64_t>(w), s);
        }));
    results.resize(stages_.size());
    for (int64_t w = 0; w < workers_; ++w)
      for (int64_t c = 0; c < virtual_stages_; ++c)
        results[StageOfChunk(schedule_, workers_, w, c)] =
            std::move(by_worker[w][c]);
  } else {
    ASSIGN_OR_RETURN(results,
                     OnAllStages<StageStepResult>(
                         [s](Stage& stage) { return stage.RunStep(s); },
                         /*all_replicas=*/true));
  }
  // Replica 0's last stage; with replicas, every micro-batch's loss from
  // the replica that ran it, added in micro-batch order as one pipeline
  // adds them.
  const StageStepResult& last = results[chunks_ - 1];
  LossResult loss = last.loss;
  if (replicas_ > 1) {
    loss = LossResult();
    for (int64_t r = 0; r < replicas_; ++r) {
      const Stage& stage = *stages_[r * chunks_ + chunks_ - 1];
      const StageStepResult& got = results[r * chunks_ + chunks_ - 1];
      for (int64_t mb = stage.placement().micro_batch_begin;
           mb < stage.placement().local_end(); ++mb)
        loss += got.losses[mb];
    }
  }
  StepReport report;
  report.step = s;
  report.loss = loss.loss_sum / last.loss_normalizer;
  report.accuracy =
      loss.counted > 0 ? static_cast<double>(loss.correct) / loss.counted : 0.0;
  report.lr = last.lr;
  report.grad_norm = last.grad_norm;
  ++step_;
  return report;
}

absl::StatusOr<EvalResult> InProcessPipeline::Evaluate(Split split,
                                                       int64_t max_samples) {
  ASSIGN_OR_RETURN(std::vector<LossResult> results,
                   OnAllStages<LossResult>([split, max_samples](Stage& stage) {
                     return stage.RunEval(split, max_samples);
                   }));
  const LossResult& total = results.back();
  EvalResult e;
  e.counted = total.counted;
  if (total.counted > 0) {
    e.loss = total.loss_sum / total.counted;
    e.accuracy = static_cast<double>(total.correct) / total.counted;
  }
  return e;
}

absl::StatusOr<Tensor> InProcessPipeline::Outputs(Split split,
                                                  int64_t max_samples) {
  std::vector<Tensor> parts;
  Stage* last = stages_[chunks_ - 1].get();
  RETURN_IF_ERROR(OnAllStages<LossResult>([&](Stage& stage) {
                    return stage.RunEval(split, max_samples,
                                         &stage == last ? &parts : nullptr);
                  }).status());
  if (parts.empty()) return Tensor();
  int64_t rows = 0;
  for (const Tensor& t : parts) rows += t.dim(0);
  Tensor all = Tensor::Empty(parts[0].shape().WithoutBatch().WithBatch(rows),
                             parts[0].dtype());
  int64_t at = 0;
  for (const Tensor& t : parts) {
    std::copy(t.f32(), t.f32() + t.numel(), all.f32() + at);
    at += t.numel();
  }
  return all;
}

std::vector<NamedTensor> InProcessPipeline::StateTensors() {
  std::vector<NamedTensor> out;
  for (int64_t i = 0; i < chunks_; ++i)
    for (NamedTensor& t : stages_[i]->model().StateTensors()) out.push_back(t);
  return out;
}

}  // namespace gpipe
