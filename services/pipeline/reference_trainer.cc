#include "services/pipeline/reference_trainer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/nn/loss.h"
#include "services/pipeline/gradient_tree.h"
#include "services/pipeline/init_weights.h"
#include "services/pipeline/job_spec.h"
#include "services/pipeline/micro_batch.h"

namespace gpipe {

absl::StatusOr<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(
    const gpipe::v1::JobSpec& spec, int64_t micro_batches,
    std::shared_ptr<const Dataset> dataset, Device device) {
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  std::unique_ptr<ReferenceTrainer> t(new ReferenceTrainer());
  t->spec_ = spec;
  t->micro_batches_ = micro_batches > 0 ? micro_batches : MicroBatchCount(spec);
  if (t->micro_batches_ > spec.batch_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batches: ", t->micro_batches_,
                     " is larger than batch_size ", spec.batch_size()));
  }
  t->groups_ = GradientGroupCount(spec);
  if (t->micro_batches_ % t->groups_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batches: ", t->micro_batches_, " is not a multiple of the ",
        t->groups_, " gradient groups"));
  }
  if (dataset != nullptr) {
    t->dataset_ = std::move(dataset);
  } else {
    ASSIGN_OR_RETURN(t->dataset_, OpenJobDataset(spec));
  }
  if (t->dataset_->size(Split::kTrain) <= 0) {
    return absl::InvalidArgumentError("data: the training split is empty");
  }
  t->sampler_ = std::make_unique<Sampler>(
      spec.seed(), t->dataset_->size(Split::kTrain), spec.batch_size());
  t->prefetch_ = std::make_unique<BatchPrefetch>(
      t->dataset_.get(), t->sampler_.get(), BatchPrefetch::Part::kWhole);
  ASSIGN_OR_RETURN(t->model_, Model::Build(spec.model(), spec.seed()));
  t->device_ = device;
  if (device != Device::kCpu) RETURN_IF_ERROR(t->model_->To(device));
  ASSIGN_OR_RETURN(t->optimizer_,
                   MakeOptimizer(spec.optimizer(), t->model_->Parameters()));
  if (spec.has_init_from()) {
    ASSIGN_OR_RETURN(const InitReport report,
                     InitWholeModel(spec, t->model_->StateTensors(),
                                    t->optimizer_->State()));
    t->init_summary_ = report.ToString();
    t->step_ = InitialStep(spec);
  }
  return t;
}

absl::StatusOr<StepReport> ReferenceTrainer::Step() {
  const int64_t s = step_;
  const Batch batch = prefetch_->Take(s);
  RETURN_IF_ERROR(model_->CheckInput(batch.inputs));
  const double normalizer = std::max<int64_t>(CountTargets(batch.targets), 1);
  LayerContext ctx;
  ctx.training = true;
  ctx.seed = spec_.seed();
  ctx.step = s;
  LossResult total;
  const std::vector<RowRange> ranges =
      SplitMicroBatches(batch.inputs.dim(0), micro_batches_);
  // The gradients of each group of micro-batches apart, summed in the
  // tree's order at the end (GradientTree): what replicas reproduce.
  GradientTree tree;
  const int64_t per_group = micro_batches_ / groups_;
  // Small micro-batches' weight halves go in groups (Model::WeightGroupSize,
  // known once the first forward saved its inputs), never across a
  // gradient group: the same bits, each gradient read and written once a
  // group instead of once a micro-batch.
  int64_t weight_group = model_->GroupsWeightHalves() ? per_group : 1;
  std::vector<std::vector<Saved>> saved(weight_group), deferred(weight_group);
  std::vector<Model::DeferredWeights> waiting;
  for (int64_t m = 0; m < static_cast<int64_t>(ranges.size()); ++m) {
    ctx.micro_batch = m;
    const Tensor x =
        batch.inputs.Rows(ranges[m].begin, ranges[m].end).To(device_);
    const Tensor targets = batch.targets.Rows(ranges[m].begin, ranges[m].end);
    const size_t slot = waiting.size();
    const Tensor logits = model_->Forward(x, ctx, &saved[slot]);
    Tensor dlogits;
    const LossResult r =
        SoftmaxCrossEntropyLoss(logits, targets, normalizer, &dlogits);
    RETURN_IF_ERROR(CheckTargetsInRange(r, logits.dim(-1)));
    total += r;
    if (m == 0 && weight_group > 1)
      weight_group = std::min(weight_group, model_->WeightGroupSize(saved[0]));
    if (weight_group == 1) {
      model_->Backward(dlogits, saved[0], ctx);
      saved[0].clear();
    } else {
      model_->BackwardGrouping(dlogits, &saved[slot], ctx, &deferred[slot]);
      waiting.push_back({&saved[slot], &deferred[slot], ctx});
      if (static_cast<int64_t>(waiting.size()) == weight_group ||
          (m + 1) % per_group == 0) {
        model_->BackwardWeights(waiting, /*every_layer=*/false);
        waiting.clear();
        for (size_t j = 0; j <= slot; ++j) {
          saved[j].clear();
          deferred[j].clear();
        }
      }
    }
    if (groups_ > 1 && (m + 1) % per_group == 0)
      RETURN_IF_ERROR(tree.Push(m / per_group, model_->Parameters()));
  }
  if (groups_ > 1)
    RETURN_IF_ERROR(FoldInto(tree.TakeForest(), groups_, model_->Parameters()));
  StepReport report;
  report.step = s;
  report.loss = total.loss_sum / normalizer;
  report.accuracy = total.counted > 0
                        ? static_cast<double>(total.correct) / total.counted
                        : 0;
  if (!std::isfinite(report.loss)) {
    return absl::FailedPreconditionError(
        // Counted from 1, as the progress bar counts the steps.
        absl::StrCat("loss is not finite (", report.loss, ") at step ", s + 1));
  }
  const std::vector<NamedParameter>& params = model_->Parameters();
  const double squares = ClipsGradients(spec_.optimizer())
                             ? AccumulateGradSquares(params, 0.0)
                             : 0.0;
  report.grad_norm = std::sqrt(squares);
  ScaleGradients(params,
                 ClipCoefficient(squares, spec_.optimizer().clip_norm()));
  report.lr = LearningRate(spec_.optimizer(), s, spec_.steps());
  // Each weight packed for the next step's products right after its
  // update, from the cache, as a stage does it.
  optimizer_->Step(report.lr, s + 1,
                   [this](size_t i) { model_->PackAfterUpdate(i); });
  model_->ZeroGrad();
  ++step_;
  return report;
}

absl::StatusOr<EvalResult> ReferenceTrainer::Evaluate(Split split,
                                                      int64_t max_samples) {
  int64_t n = dataset_->size(split);
  if (max_samples > 0) n = std::min(n, max_samples);
  const int64_t batch_size = spec_.eval().batch_size() > 0
                                 ? spec_.eval().batch_size()
                                 : spec_.batch_size();
  LayerContext ctx;
  ctx.training = false;
  ctx.seed = spec_.seed();
  LossResult total;
  std::vector<int64_t> indices;
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    const int64_t end = std::min(n, begin + batch_size);
    indices.resize(end - begin);
    std::iota(indices.begin(), indices.end(), begin);
    const Batch batch = dataset_->Gather(split, indices);
    const Tensor logits =
        model_->Forward(batch.inputs.To(device_), ctx, nullptr);
    const LossResult r =
        SoftmaxCrossEntropyLoss(logits, batch.targets, 1.0, nullptr);
    RETURN_IF_ERROR(CheckTargetsInRange(r, logits.dim(-1)));
    total += r;
  }
  EvalResult result;
  result.counted = total.counted;
  if (total.counted > 0) {
    result.loss = total.loss_sum / total.counted;
    result.accuracy = static_cast<double>(total.correct) / total.counted;
  }
  return result;
}

}  // namespace gpipe
