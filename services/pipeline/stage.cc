#include "services/pipeline/stage.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "services/core/status.h"
#include "services/core/strings.h"
#include "services/nn/layer_spec.h"
#include "services/pipeline/job_spec.h"
#include "services/tensor/allocator.h"
#include "services/tensor/device.h"

namespace gpipe {
namespace {

// A replica's schedule: the ops of its local micro-batches, named by their
// place in the whole step.
std::vector<Op> Shifted(std::vector<Op> ops, int64_t by) {
  for (Op& op : ops)
    if (op.kind != OpKind::kOptimizerStep) op.micro_batch += by;
  return ops;
}

}  // namespace

Stage::Stage(const gpipe::v1::JobSpec& spec, const StagePlacement& placement,
             Timeline::Clock::time_point origin)
    : spec_(spec),
      placement_(placement),
      remat_(StageRematerializes(placement.remat, placement.index,
                                 placement.count)),
      // An interleaved schedule is a worker's, over several stages: the
      // worker drives each stage op by op (RunOp), not RunStep.
      schedule_(WithTransfers(
          !placement.ops.empty() ? placement.ops
          : Interleaves(placement.schedule)
              ? std::vector<Op>()
              : Shifted(MakeSchedule(placement.schedule, placement.count,
                                     placement.local_micro_batches(),
                                     placement.index),
                        placement.micro_batch_begin),
          placement.schedule, placement.count, 1, placement.index)),
      timeline_(origin),
      layer_timing_(0) {}

absl::StatusOr<std::unique_ptr<Stage>> Stage::Create(
    const gpipe::v1::JobSpec& spec, const StagePlacement& placement,
    std::shared_ptr<const Dataset> dataset, Link* upstream, Link* downstream,
    Timeline::Clock::time_point origin) {
  if (placement.count < 1 || placement.index < 0 ||
      placement.index >= placement.count || placement.micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", placement.index, " of ", placement.count, " with ",
        placement.micro_batches, " micro-batches is not a valid placement"));
  }
  if (placement.micro_batches > spec.batch_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batches: ", placement.micro_batches,
                     " is larger than batch_size ", spec.batch_size()));
  }
  const int64_t groups = placement.gradient_groups;
  if (groups < 1 || placement.micro_batches % groups != 0 ||
      placement.micro_batch_begin < 0 ||
      placement.micro_batch_begin >= placement.local_end() ||
      placement.local_end() > placement.micro_batches ||
      placement.micro_batch_begin % placement.group_size() != 0 ||
      placement.local_end() % placement.group_size() != 0 ||
      (placement.reducer == nullptr &&
       placement.local_micro_batches() != placement.micro_batches)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", placement.index, ": micro-batches [",
                     placement.micro_batch_begin, ", ", placement.local_end(),
                     ") of ", placement.micro_batches, " in ", groups,
                     " gradient groups are not whole groups of a replica"));
  }
  // The norms add their parameter gradients in a split backward's input
  // half, the rest in its weight half; with several groups on this stage
  // the next micro-batch's input half may run before this one's weight
  // half, and the group boundary would cut the two apart.
  const bool splits =
      SplitsBackward(placement.schedule) ||
      std::any_of(placement.ops.begin(), placement.ops.end(), [](const Op& op) {
        return op.kind == OpKind::kBackwardInput;
      });
  if (splits && placement.local_micro_batches() / placement.group_size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", placement.index,
        ": a split backward with several gradient groups on one stage is "
        "not supported"));
  }
  if ((placement.first() || placement.last()) && dataset == nullptr) {
    return absl::InvalidArgumentError(
        "the first and the last stage need the dataset");
  }
  if ((!placement.first() && upstream == nullptr) ||
      (!placement.last() && downstream == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", placement.index, " is missing a link"));
  }
  for (const Op& op : placement.ops) {
    if (op.kind != OpKind::kOptimizerStep &&
        (op.micro_batch < placement.micro_batch_begin ||
         op.micro_batch >= placement.local_end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stage ", placement.index, ": op ", ToString(op),
          " names no micro-batch of [", placement.micro_batch_begin, ", ",
          placement.local_end(), ")"));
    }
  }
  std::unique_ptr<Stage> stage(new Stage(spec, placement, origin));
  ASSIGN_OR_RETURN(const ModelShapes shapes, InferModelShapes(spec.model()));
  if (placement.layer_begin < 0 ||
      placement.layer_end <= placement.layer_begin ||
      placement.layer_end > static_cast<int64_t>(shapes.outputs.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage ", placement.index, ": layers [", placement.layer_begin, ", ",
        placement.layer_end, ") are not layers of the model's ",
        shapes.outputs.size()));
  }
  stage->input_sample_ = shapes.inputs[placement.layer_begin];
  stage->output_sample_ = shapes.outputs[placement.layer_end - 1];
  stage->micro_batch_rows_ =
      SplitMicroBatches(spec.batch_size(), placement.micro_batches);
  stage->dataset_ = std::move(dataset);
  stage->upstream_ = upstream;
  stage->downstream_ = downstream;
  if (stage->dataset_ != nullptr) {
    stage->sampler_ = std::make_unique<Sampler>(
        spec.seed(), stage->dataset_->size(Split::kTrain), spec.batch_size());
    // The last stage's inputs come down the pipe: it needs the targets only.
    if (placement.first() || placement.last()) {
      stage->prefetch_ = std::make_unique<BatchPrefetch>(
          stage->dataset_.get(), stage->sampler_.get(),
          placement.first() ? BatchPrefetch::Part::kWhole
                            : BatchPrefetch::Part::kTargets);
    }
  }
  ASSIGN_OR_RETURN(stage->model_,
                   Model::Build(spec.model(), spec.seed(),
                                placement.layer_begin, placement.layer_end));
  stage->layer_timing_ =
      LayerTiming(stage->model_->size(), placement.compute_slowdown);
  stage->model_->set_timing(&stage->layer_timing_);
  if (placement.device != Device::kCpu) {
    RETURN_IF_ERROR(stage->model_->To(placement.device));
    stage->device_ = DeviceTransfer::Create();
    if (stage->device_ == nullptr)
      return absl::FailedPreconditionError("stage device: no GPU present");
  }
  ASSIGN_OR_RETURN(
      stage->optimizer_,
      MakeOptimizer(spec.optimizer(), stage->model_->Parameters()));
  // Optimizer state was zeroed on this thread's stream, not the stage's.
  if (stage->device_ != nullptr) SynchronizeCuda();
  const bool running = stage->model_->RunningStatisticsWidth() > 0;
  stage->holds_back_statistics_ = stage->device_ == nullptr && running;
  // A GPU stage moves batch norm's averages inside each forward: replicas
  // would each see their own micro-batches only, and a step cut off
  // midway would leave a parked state's averages half-moved.
  if (running && stage->device_ != nullptr &&
      (placement.reducer != nullptr || ReplicaCount(spec) > 1)) {
    return absl::UnimplementedError(absl::StrCat(
        "stage ", placement.index,
        ": batch norm with data-parallel replicas runs on the CPU so far "
        "(its running averages move by every replica's micro-batches on "
        "the host); run this model's replicas on CPU workers, or one "
        "replica on GPUs"));
  }
  return stage;
}

// A GPU stage copies what it sends through the host unless the link takes
// device tensors (the CUDA IPC plane); what such a link delivers is on the
// device already, and ToDevice passes it through.
Tensor Stage::ForLink(Link* link, Tensor t) {
  if (device_ == nullptr || link->CarriesDeviceTensors()) return t;
  return device_->ToHost(t);
}

LayerContext Stage::Context(int64_t step, int64_t m) const {
  LayerContext ctx;
  ctx.training = step != kEvalStep;
  ctx.seed = spec_.seed();
  ctx.step = step;
  ctx.micro_batch = m;
  if (ctx.training && holds_back_statistics_ && current_ != nullptr)
    ctx.running_statistics = &current_->running_log;
  return ctx;
}

absl::StatusOr<Message> Stage::Expect(Link* link, MessageKind kind,
                                      int64_t step, int64_t micro_batch) {
  ASSIGN_OR_RETURN(Message m, link->Receive());
  if (m.kind != kind || m.step != step ||
      (kind != MessageKind::kGradSquares && m.micro_batch != micro_batch)) {
    Message want;
    want.kind = kind;
    want.step = step;
    want.micro_batch = micro_batch;
    return absl::InternalError(absl::StrCat("stage ", placement_.index,
                                            ": expected ", Describe(want),
                                            ", received ", Describe(m)));
  }
  return m;
}

absl::Status Stage::CheckArrived(const Tensor& t, bool activation, int64_t m,
                                 int64_t rows, int64_t max_rows) const {
  const Shape& sample = activation ? input_sample_ : output_sample_;
  const bool fits = t.dtype() == DType::kF32 &&
                    t.shape().rank() == sample.rank() + 1 &&
                    t.shape().WithoutBatch() == sample &&
                    (rows > 0 ? t.shape()[0] == rows
                              : t.shape()[0] >= 1 && t.shape()[0] <= max_rows);
  if (fits) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "stage ", placement_.index, ": micro-batch ", m, "'s ",
      activation ? "activation from the upstream stage"
                 : "gradient from the downstream stage",
      " is ", AsAbsl(DTypeName(t.dtype())), " ", t.shape().ToString(),
      "; this stage takes float32 ",
      rows > 0 ? sample.WithBatch(rows).ToString()
               : absl::StrCat("[1..", max_rows, "] x ", sample.ToString()),
      " (a neighbour of another model or cut?)"));
}

absl::Status Stage::Forward(int64_t step, int64_t m, const Batch& batch,
                            const std::vector<RowRange>& ranges,
                            double normalizer, std::vector<InFlight>& flight,
                            StageStepResult& result) {
  InFlight& f = flight[m];
  RETURN_IF_ERROR(CheckTransfersAround(/*forward=*/true, m, f));
  // Waiting for the activation was its receive's: bubble, not forward time.
  OpTimer timer(timeline_, Phase::kForward, m);
  Tensor x;
  if (placement_.first()) {
    x = batch.inputs.Rows(ranges[m].begin, ranges[m].end);
    if (device_ != nullptr) x = device_->ToDevice(x);
  } else {
    timer.record().bytes_received = f.activation_in.nbytes();
    Tensor in = std::exchange(f.activation_in, Tensor());
    x = device_ != nullptr ? device_->ToDevice(in) : std::move(in);
  }
  const LayerContext ctx = Context(step, m);
  Tensor y = model_->Forward(x, ctx, remat_ ? nullptr : &f.saved);
  if (remat_) f.input = x;
  if (placement_.last()) {
    const LossResult r = SoftmaxCrossEntropyLoss(
        y, batch.targets.Rows(ranges[m].begin, ranges[m].end), normalizer,
        &f.dlogits);
    RETURN_IF_ERROR(CheckTargetsInRange(r, y.dim(-1)));
    result.loss += r;
    result.losses[m] = r;
    return absl::OkStatus();
  }
  timer.record().bytes_sent = y.nbytes();
  f.activation_out = ForLink(downstream_, std::move(y));
  return absl::OkStatus();
}

absl::Status Stage::CheckTransfersAround(bool forward, int64_t m,
                                         const InFlight& f) const {
  const bool receives = forward ? !placement_.first() : !placement_.last();
  const bool sends = forward ? !placement_.last() : !placement_.first();
  const std::string op = absl::StrCat(forward ? "F" : "B", m);
  if (receives && !(forward ? f.activation_in : f.gradient_in).defined()) {
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", placement_.index, ": the schedule runs ", op,
                     " before receiving its ",
                     forward ? "activation (ra" : "gradient (rg", m, ")"));
  }
  if (sends && (forward ? f.activation_out : f.gradient_out).defined()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", placement_.index, ": the schedule runs ", op,
        " again before sending its ",
        forward ? "activation (sa" : "input gradient (sg", m, ")"));
  }
  return absl::OkStatus();
}

absl::Status Stage::Receive(int64_t step, int64_t m, OpKind kind,
                            std::vector<InFlight>& flight) {
  const bool activation = kind == OpKind::kReceiveActivation;
  Link* link = activation ? upstream_ : downstream_;
  InFlight& f = flight[m];
  Tensor& slot = activation ? f.activation_in : f.gradient_in;
  if (link == nullptr || slot.defined()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", placement_.index, ": the schedule receives micro-batch ", m,
        "'s ", activation ? "activation" : "gradient",
        link == nullptr
            ? absl::StrCat(" with no ", activation ? "upstream" : "downstream",
                           " stage")
            : " twice before using it"));
  }
  ASSIGN_OR_RETURN(Message in, Expect(link,
                                      activation ? MessageKind::kActivation
                                                 : MessageKind::kGradient,
                                      step, m));
  const RowRange rows = micro_batch_rows_[m];
  RETURN_IF_ERROR(
      CheckArrived(in.tensor, activation, m, rows.end - rows.begin, 0));
  slot = std::move(in.tensor);
  return absl::OkStatus();
}

absl::Status Stage::Send(int64_t step, int64_t m, OpKind kind,
                         std::vector<InFlight>& flight) {
  const bool activation = kind == OpKind::kSendActivation;
  Link* link = activation ? downstream_ : upstream_;
  InFlight& f = flight[m];
  Tensor& slot = activation ? f.activation_out : f.gradient_out;
  if (link == nullptr || !slot.defined()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", placement_.index, ": the schedule sends micro-batch ", m,
        "'s ", activation ? "activation" : "input gradient",
        link == nullptr
            ? absl::StrCat(" with no ", activation ? "downstream" : "upstream",
                           " stage")
            : absl::StrCat(" before its ", activation ? "forward" : "backward",
                           " made it, or twice")));
  }
  Message out;
  out.kind = activation ? MessageKind::kActivation : MessageKind::kGradient;
  out.step = step;
  out.micro_batch = m;
  out.tensor = std::exchange(slot, Tensor());
  const int64_t start = timeline_.Now();
  RETURN_IF_ERROR(link->Send(std::move(out)));
  // Handing the output to the link is the op's last part, as it was
  // before sends were actions of their own.
  timeline_.RecordSend(activation ? Phase::kForward : f.gradient_phase, m,
                       start, timeline_.Now());
  if (!activation) return SettleWeights(*current_, m, /*open=*/false);
  return absl::OkStatus();
}

absl::Status Stage::CheckTransfersDone() const {
  for (size_t m = 0; m < current_->flight.size(); ++m) {
    const InFlight& f = current_->flight[m];
    const char* left =
        f.activation_in.defined()    ? "received the activation"
        : f.gradient_in.defined()    ? "received the gradient"
        : f.activation_out.defined() ? "did not send the activation"
        : f.gradient_out.defined()   ? "did not send the input gradient"
                                     : nullptr;
    if (left != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage ", placement_.index, ": the step's schedule ", left,
          " of micro-batch ", m,
          std::string_view(left).starts_with("received") ? " and did not use it"
                                                         : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status Stage::Backward(int64_t step, int64_t m, OpKind kind,
                             std::vector<InFlight>& flight) {
  InFlight& f = flight[m];
  // Its forward's record, and no input half already run on it.
  if ((remat_ ? !f.input.defined() : f.saved.empty()) || !f.deferred.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", placement_.index,
                     ": the schedule runs the backward of "
                     "micro-batch ",
                     m, " without its forward (before it, or twice)"));
  }
  RETURN_IF_ERROR(CheckTransfersAround(/*forward=*/false, m, f));
  StepState& st = *current_;
  const bool split = kind == OpKind::kBackwardInput;
  // Gradients add in the order the backwards ran, and a gradient group's
  // sum is pushed before the next group's gradients come: what earlier
  // backwards left for their sends runs first (a hand-made schedule that
  // runs this backward before an earlier one's send), and the open group
  // too unless this whole backward joins it.
  RETURN_IF_ERROR(SettleWeights(st, m - 1,
                                /*open=*/split || st.weight_group.empty() ||
                                    m != st.weight_group.back() + 1));
  Tensor dy;
  int64_t received = 0;
  if (placement_.last()) {
    dy = std::move(f.dlogits);
  } else {
    received = f.gradient_in.nbytes();
    Tensor in = std::exchange(f.gradient_in, Tensor());
    dy = device_ != nullptr ? device_->ToDevice(in) : std::move(in);
  }
  const LayerContext ctx = Context(step, m);
  if (remat_) {
    OpTimer recompute(timeline_, Phase::kRecompute, m);
    LayerContext again = ctx;
    again.recompute = true;
    model_->Forward(f.input, again, &f.saved);
    f.input = Tensor();
  }
  bool grouping = false;
  {
    OpTimer timer(timeline_, split ? Phase::kBackwardInput : Phase::kBackward,
                  m);
    timer.record().bytes_received = received;
    Tensor dx;
    if (split) {
      // Keeps what the weight half reads; the rest of the micro-batch's
      // activations go now.
      dx = model_->BackwardInput(dy, &f.saved, ctx, &f.deferred);
      f.KeepWeightOperands();
    } else if (WeightGroupSize(st, m, /*whole=*/true) > 1) {
      // The grouping layers' weight halves wait for the group's last
      // backward (RunWeightGroup); the other layers' gradients go in now.
      dx = model_->BackwardGrouping(dy, &f.saved, ctx, &f.deferred);
      f.KeepWeightOperands();
      f.weight_waits = true;
      st.weight_group.push_back(m);
      grouping = true;
    } else {
      dx = model_->Backward(dy, f.saved, ctx, Bucketer(st));
      RETURN_IF_ERROR(st.bucket_status);
      ++st.weights_done;
      f.Release();
    }
    if (!placement_.first()) {
      timer.record().bytes_sent = dx.nbytes();
      f.gradient_out = ForLink(upstream_, std::move(dx));
      f.gradient_phase = split ? Phase::kBackwardInput : Phase::kBackward;
      f.weights_due = !split && !grouping;
      if (f.weights_due) st.settled_below = std::min(st.settled_below, m);
    }
  }
  if (grouping) {
    // A whole backward's group is its gradient group's micro-batches
    // (WholeBackwardsGroupSize): it ends with that group or the step.
    const bool ends = (m + 1) % placement_.group_size() == 0 ||
                      m + 1 == placement_.local_end();
    if (!ends) return absl::OkStatus();
    // Once the input gradient is sent: the stage upstream waits for it,
    // not for the group.
    if (!placement_.first()) {
      f.weight_group_due = std::exchange(st.weight_group, {});
      st.settled_below = std::min(st.settled_below, m);
      return absl::OkStatus();
    }
    return RunWeightGroup(st, std::exchange(st.weight_group, {}));
  }
  if (placement_.first())
    return split ? absl::OkStatus() : WeightGradientDone(m);
  return absl::OkStatus();
}

int64_t Stage::WeightGroupSize(StepState& st, int64_t m, bool whole) {
  if (whole && remat_) return 1;
  if (st.weight_group_size == 0) {
    // Sized for the step's largest micro-batch (the first), as the memory
    // model sizes it, whichever this stage's first is.
    const auto samples = [&](int64_t i) {
      return micro_batch_rows_[i].end - micro_batch_rows_[i].begin;
    };
    st.weight_group_size =
        device_ != nullptr
            ? 1
            : std::min(placement_.group_size(),
                       model_->WeightGroupSize(st.flight[m].saved, samples(m),
                                               samples(0)));
  }
  return whole ? WholeBackwardsGroupSize(st.weight_group_size,
                                         placement_.group_size())
               : st.weight_group_size;
}

absl::Status Stage::RunWeights(StepState& st, std::span<const int64_t> members,
                               bool every_layer) {
  std::vector<Model::DeferredWeights> group;
  for (const int64_t m : members) {
    const InFlight& f = st.flight[m];
    group.push_back({&f.saved, &f.deferred, Context(st.step, m)});
  }
  const int64_t start = timeline_.Now();
  model_->BackwardWeights(group, every_layer,
                          Bucketer(st, static_cast<int64_t>(members.size())));
  const int64_t end = timeline_.Now();
  // The group's time shared out: each micro-batch's weight half shows in
  // the trace and the phase times as its own op.
  const int64_t n = static_cast<int64_t>(members.size());
  for (int64_t i = 0; i < n; ++i) {
    timeline_.Record({Phase::kBackwardWeight, members[i],
                      start + (end - start) * i / n,
                      start + (end - start) * (i + 1) / n});
  }
  RETURN_IF_ERROR(st.bucket_status);
  st.weights_done += n;
  for (const int64_t m : members) st.flight[m].Release();
  return absl::OkStatus();
}

absl::Status Stage::RunWeightGroup(StepState& st,
                                   std::vector<int64_t> members) {
  if (members.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(RunWeights(st, members, /*every_layer=*/false));
  for (const int64_t m : members) RETURN_IF_ERROR(WeightGradientDone(m));
  return absl::OkStatus();
}

absl::Status Stage::SettleWeights(StepState& st, int64_t through, bool open) {
  const int64_t end =
      std::min<int64_t>(through + 1, static_cast<int64_t>(st.flight.size()));
  for (int64_t m = st.settled_below; m < end; ++m) {
    InFlight& f = st.flight[m];
    if (std::exchange(f.weights_due, false))
      RETURN_IF_ERROR(WeightGradientDone(m));
    if (!f.weight_group_due.empty()) {
      RETURN_IF_ERROR(
          RunWeightGroup(st, std::exchange(f.weight_group_due, {})));
    }
  }
  st.settled_below = std::max(st.settled_below, end);
  if (!open) return absl::OkStatus();
  return RunWeightGroup(st, std::exchange(st.weight_group, {}));
}

std::function<void(int64_t)> Stage::Bucketer(StepState& st, int64_t count) {
  const bool last = placement_.reducer != nullptr &&
                    placement_.reducer->SupportsBuckets() &&
                    local_groups() == 1 &&
                    st.weights_done + count == placement_.local_micro_batches();
  if (!last) return nullptr;
  return [this, &st](int64_t layer) { BucketLayer(st, layer); };
}

// Large enough that a message's fixed cost stays small against its bytes,
// small enough that the last bucket (the stage's first layers, which
// nothing is left to overlap) is short.
constexpr int64_t kBucketBytes = int64_t{1} << 20;

void Stage::BucketLayer(StepState& st, int64_t layer) {
  const std::vector<NamedParameter>& params = model_->Parameters();
  if (layer_params_.empty()) {
    int64_t at = 0;
    for (int64_t i = 0; i < model_->size(); ++i) {
      layer_params_.push_back(at);
      at += static_cast<int64_t>(model_->layer(i).Parameters().size());
    }
    layer_params_.push_back(at);
  }
  if (!st.bucket_status.ok()) return;
  const int64_t begin = layer_params_[layer], end = layer_params_[layer + 1];
  if (end > begin) {
    if (st.bucket_end == st.bucket_begin) st.bucket_end = end;
    st.bucket_begin = begin;  // layers come last to first
    for (int64_t i = begin; i < end; ++i)
      st.bucket_bytes += params[i].param->grad.nbytes();
  }
  if (st.bucket_end == st.bucket_begin ||
      (st.bucket_bytes < kBucketBytes && layer > 0)) {
    return;
  }
  GradientNode node;
  node.first = first_group();
  std::vector<NamedParameter> bucket(params.begin() + st.bucket_begin,
                                     params.begin() + st.bucket_end);
  // Copied once this layer's kernels are done.
  if (device_ != nullptr) bucket = MirrorOnHost(std::move(bucket), st);
  for (const NamedParameter& p : bucket) node.grads.push_back(p.param->grad);
  if (st.summing == nullptr) st.summing = placement_.reducer;
  st.bucket_status =
      placement_.reducer->StartBucket(placement_.replica, st.step, st.buckets++,
                                      std::move(node), std::move(bucket));
  st.bucket_begin = st.bucket_end = st.bucket_bytes = 0;
}

int64_t Stage::first_group() const {
  return placement_.micro_batch_begin / placement_.group_size();
}

int64_t Stage::local_groups() const {
  return placement_.local_micro_batches() / placement_.group_size();
}

absl::Status Stage::WeightGradientDone(int64_t m) {
  const int64_t per_group = placement_.group_size();
  // One group here: the gradients themselves are this stage's node.
  if (local_groups() == 1) return absl::OkStatus();
  // A group's sum is its micro-batches' in order; one out of order would
  // land in the wrong group (a broken schedule, given as ops).
  StepState& st = *current_;
  const int64_t due =
      st.next_weight < 0 ? placement_.micro_batch_begin : st.next_weight;
  if (m != due) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage ", placement_.index, ": the weight gradient of micro-batch ", m,
        " came where micro-batch ", due,
        "'s was due: gradient groups sum their micro-batches in order"));
  }
  st.next_weight = m + 1;
  if ((m + 1) % per_group != 0) return absl::OkStatus();
  return current_->groups.Push(m / per_group, model_->Parameters());
}

absl::Status Stage::SumGradientGroups() {
  if (placement_.gradient_groups == 1) return absl::OkStatus();
  StepState& st = *current_;
  if (st.summing != nullptr) {
    // The buckets handed in during the last backward: wait for the rest.
    // The time counted is the sums' own, not the backward they overlapped.
    GradientReducer* reducer = std::exchange(st.summing, nullptr);
    ASSIGN_OR_RETURN(last_reduce_seconds_, reducer->FinishBuckets());
    ReturnToDevice(st);
    return absl::OkStatus();
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Cleanup timed = [&] {
    last_reduce_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
  };
  // A GPU stage's replicas add host copies (MirrorOnHost).
  const bool via_host = placement_.reducer != nullptr && device_ != nullptr;
  std::vector<NamedParameter> params = model_->Parameters();
  if (via_host) params = MirrorOnHost(std::move(params), st);
  std::vector<GradientNode> forest;
  if (local_groups() == 1) {
    GradientNode node;
    node.first = first_group();
    for (const NamedParameter& p : params) node.grads.push_back(p.param->grad);
    forest.push_back(std::move(node));
  } else {
    forest = st.groups.TakeForest();
    if (via_host) {
      for (GradientNode& node : forest)
        for (Tensor& g : node.grads) g = g.To(Device::kCpu);
    }
  }
  if (placement_.reducer == nullptr)
    return FoldInto(std::move(forest), placement_.gradient_groups, params);
  RETURN_IF_ERROR(placement_.reducer->Reduce(placement_.replica, st.step,
                                             std::move(forest), params));
  ReturnToDevice(st);
  return absl::OkStatus();
}

// The reducers add host tensors (over links, the bytes travel from the
// host anyway): the tree adds host copies exactly as on a CPU stage, and
// the totals come back into the device gradients. The copies run on the
// stage's compute stream (OnStage), so they follow the backward that
// produced the gradients and precede the update.
std::vector<NamedParameter> Stage::MirrorOnHost(
    std::vector<NamedParameter> params, StepState& st) {
  for (NamedParameter& p : params) {
    auto host = std::make_unique<Parameter>();
    host->name = p.param->name;
    host->grad = p.param->grad.To(Device::kCpu);
    st.device_grads.push_back(p.param->grad);
    p.param = host.get();
    st.host_grads.push_back(std::move(host));
  }
  return params;
}

void Stage::ReturnToDevice(StepState& st) {
  for (size_t i = 0; i < st.device_grads.size(); ++i)
    st.device_grads[i].CopyFrom(st.host_grads[i]->grad);
  st.device_grads.clear();
  st.host_grads.clear();
}

// Nobody waits for it: under zero-bubble schedules it runs where the stage
// would otherwise wait. The weight halves of a stage run in micro-batch
// order, so each parameter's gradient sums as in the reference.
absl::Status Stage::BackwardWeight(int64_t step, int64_t m,
                                   std::vector<InFlight>& flight) {
  InFlight& f = flight[m];
  if (f.deferred.empty() || f.weight_waits) {
    return absl::FailedPreconditionError(
        absl::StrCat("stage ", placement_.index, ": the schedule runs W", m,
                     " (the weight half of micro-batch ", m,
                     ") without its input half "
                     "waiting for it"));
  }
  StepState& st = *current_;
  RETURN_IF_ERROR(SettleWeights(st, m - 1, /*open=*/true));
  OpTimer timer(timeline_, Phase::kBackwardWeight, m);
  model_->BackwardWeight(f.saved, f.deferred, Context(step, m), Bucketer(st));
  RETURN_IF_ERROR(st.bucket_status);
  ++st.weights_done;
  f.Release();
  return WeightGradientDone(m);
}

Message Stage::GradSquares(int64_t step, double squares) {
  Message m;
  m.kind = MessageKind::kGradSquares;
  m.step = step;
  m.scalar = squares;
  return m;
}

// Global-norm clipping across stages: the squared norm is folded parameter by
// parameter down the chain (stage i continues from stage i-1's sum), which
// is exactly the single-process order; the total then travels back up
// (FinishStep).
absl::Status Stage::SendGradSquares() {
  if (!current_) return absl::FailedPreconditionError("no step begun");
  StepState& st = *current_;
  OnStage on_stage(*this);
  RETURN_IF_ERROR(CheckTransfersDone());
  // Whole backwards whose group never closed (a schedule that never ran a
  // later one, which the loop below names) add their gradients now.
  RETURN_IF_ERROR(SettleWeights(st, static_cast<int64_t>(st.flight.size()),
                                /*open=*/true));
  // A backward or a weight half that never ran would leave its gradient
  // out.
  for (size_t m = 0; m < st.flight.size(); ++m) {
    const InFlight& f = st.flight[m];
    if (!f.deferred.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "stage ", placement_.index, ": the schedule never runs W", m,
          " (the weight half of micro-batch ", m, ") before its step"));
    }
    if (!f.saved.empty() || f.input.defined() || f.dlogits.defined()) {
      return absl::FailedPreconditionError(
          absl::StrCat("stage ", placement_.index,
                       ": the schedule never runs the backward of micro-batch ",
                       m, " before its step"));
    }
  }
  RETURN_IF_ERROR(SumGradientGroups());
  RETURN_IF_ERROR(GatherRunningStatistics());
  if (placement_.last()) {
    const double loss = st.result.loss.loss_sum / st.result.loss_normalizer;
    if (!std::isfinite(loss)) {
      return absl::FailedPreconditionError(
          // Counted from 1, as the progress bar counts the steps.
          absl::StrCat("loss is not finite (", loss, ") at step ",
                       st.step + 1));
    }
  }
  // This stage's own squares first: its gradients are final, and the
  // running sum from upstream comes only after the stages before it drain
  // (the first stage's last backward is the step's last op), so the pass
  // leaves the exchange's critical path. Folded in the same order, the
  // total is the same bits. Without clipping there is nothing to sum
  // (ClipsGradients), and the exchange is only the barrier before updates.
  const std::vector<double> own =
      ClipsGradients(spec_.optimizer())
          ? GradSquaresByParameter(model_->Parameters())
          : std::vector<double>();
  double squares = 0.0;
  if (!placement_.first()) {
    ASSIGN_OR_RETURN(Message in,
                     Expect(upstream_, MessageKind::kGradSquares, st.step, -1));
    squares = in.scalar;
  }
  squares = FoldGradSquares(own, squares);
  pending_update_ = st.step;  // the gradients are final from here
  // Kept past the step's records, which a failed step drops (RunStep):
  // a roll-forward needs them as much as the gradients.
  pending_running_rows_ = st.running_rows;
  if (!placement_.last())
    RETURN_IF_ERROR(downstream_->Send(GradSquares(st.step, squares)));
  st.squares = squares;
  return absl::OkStatus();
}

absl::StatusOr<StageStepResult> Stage::FinishStep() {
  if (!current_) return absl::FailedPreconditionError("no step begun");
  StepState& st = *current_;
  OnStage on_stage(*this);
  double squares = st.squares;
  if (!placement_.last()) {
    ASSIGN_OR_RETURN(
        Message total,
        Expect(downstream_, MessageKind::kGradSquares, st.step, -1));
    squares = total.scalar;
  }
  {
    // Waiting for the total (the rest of the pipeline draining) is bubble:
    // the op is the update itself (the sum of squares before is a cheap
    // read).
    OpTimer timer(timeline_, Phase::kOptimizer, -1);
    if (!placement_.first())
      RETURN_IF_ERROR(upstream_->Send(GradSquares(st.step, squares)));
    ASSIGN_OR_RETURN(st.result.lr,
                     ApplyUpdate(st.step, squares, st.running_rows));
  }
  st.result.grad_norm = std::sqrt(squares);
  timeline_.EndStep();
  layer_timing_.EndStep(placement_.local_micro_batches());
  last_peak_bytes_ = Counted().peak_bytes();
  st.result.peak_activation_bytes = last_peak_bytes_;
  StageStepResult result = std::move(st.result);
  current_.reset();
  return result;
}

absl::Status Stage::GatherRunningStatistics() {
  if (!holds_back_statistics_) return absl::OkStatus();
  StepState& st = *current_;
  ASSIGN_OR_RETURN(Tensor rows,
                   model_->RunningStatisticsRows(st.running_log,
                                                 placement_.micro_batch_begin,
                                                 placement_.local_end()));
  if (placement_.reducer != nullptr) {
    ASSIGN_OR_RETURN(rows, placement_.reducer->GatherRows(
                               placement_.replica, st.step, std::move(rows)));
  }
  if (rows.dim(0) != placement_.micro_batches) {
    return absl::InternalError(
        absl::StrCat("stage ", placement_.index, ": running statistics of ",
                     rows.dim(0), " micro-batches gathered at step ", st.step,
                     ", expected ", placement_.micro_batches));
  }
  st.running_rows = std::move(rows);
  return absl::OkStatus();
}

Tensor Stage::pending_running_statistics() const {
  return pending_update_ >= 0 ? pending_running_rows_ : Tensor();
}

absl::StatusOr<float> Stage::ApplyUpdate(int64_t step, double squares,
                                         const Tensor& running_rows) {
  // Checked before anything moves, so a refusal leaves the stage as it was.
  if (holds_back_statistics_ &&
      (!running_rows.defined() || running_rows.rank() != 2 ||
       running_rows.dim(0) != placement_.micro_batches ||
       running_rows.dim(1) != model_->RunningStatisticsWidth())) {
    return absl::DataLossError(absl::StrCat(
        "stage ", placement_.index, ": the update of step ", step,
        " has no batch norm statistics of its ", placement_.micro_batches,
        " micro-batches to move the running averages by"));
  }
  const std::vector<NamedParameter>& params = model_->Parameters();
  ScaleGradients(params,
                 ClipCoefficient(squares, spec_.optimizer().clip_norm()));
  const float lr = LearningRate(spec_.optimizer(), step, spec_.steps());
  // Cleared only if the update ran to its end (an exception leaves it).
  update_in_progress_ = true;
  if (holds_back_statistics_)
    RETURN_IF_ERROR(model_->ApplyRunningStatistics(running_rows));
  // Each Linear's weight packed for the next step's products (rather than
  // by its first forward and backward: the neighbours wait for those,
  // while a stage other than the first would idle here anyway until its
  // first micro-batch arrives), right after its update, from the cache.
  optimizer_->Step(lr, step + 1,
                   [this](size_t i) { model_->PackAfterUpdate(i); });
  update_in_progress_ = false;
  pending_update_ = -1;
  pending_running_rows_ = Tensor();
  last_update_step_ = step;
  last_update_squares_ = squares;
  model_->ZeroGrad();
  // The update is queued on the stage's stream; whoever reads the
  // parameters next (a checkpoint, the final write, an evaluation from
  // another thread's stream) must see it done.
  if (device_ != nullptr) SynchronizeCuda();
  return lr;
}

absl::Status Stage::RollForward(int64_t step, double squares,
                                const std::map<std::string, Tensor>& grads,
                                const Tensor& running_statistics) {
  OnStage on_stage(*this);
  const std::vector<NamedParameter>& params = model_->Parameters();
  for (const NamedParameter& p : params) {
    auto it = grads.find(p.name);
    if (it == grads.end() || it->second.shape() != p.param->grad.shape() ||
        it->second.dtype() != p.param->grad.dtype()) {
      return absl::DataLossError(absl::StrCat("roll forward of step ", step,
                                              ": no gradient of the shape of ",
                                              p.name));
    }
  }
  for (const NamedParameter& p : params)
    p.param->grad.CopyFrom(grads.at(p.name));
  return ApplyUpdate(step, squares, running_statistics).status();
}

absl::Status Stage::BeginStep(int64_t step) {
  // A step that failed midway leaves nothing to the next one.
  current_.reset();
  pending_update_ = -1;
  pending_running_rows_ = Tensor();
  OnStage on_stage(*this);
  Counted().ResetPeak();
  timeline_.BeginStep(step);
  current_ = std::make_unique<StepState>();
  StepState& st = *current_;
  st.step = step;
  st.result.step = step;
  if (placement_.first() || placement_.last()) {
    st.batch = prefetch_->Take(step);
    // Once for the step's batch, not per micro-batch.
    if (placement_.first())
      RETURN_IF_ERROR(model_->CheckInput(st.batch.inputs));
    st.ranges =
        SplitMicroBatches(sampler_->batch_size(), placement_.micro_batches);
    if (placement_.last())
      st.result.loss_normalizer =
          std::max<int64_t>(CountTargets(st.batch.targets), 1);
  }
  st.flight.resize(placement_.micro_batches);
  if (placement_.last()) st.result.losses.resize(placement_.micro_batches);
  return absl::OkStatus();
}

absl::Status Stage::RunOp(const Op& op) {
  if (!current_) return absl::FailedPreconditionError("no step begun");
  StepState& st = *current_;
  if (op.kind == OpKind::kOptimizerStep) {
    return absl::InvalidArgumentError(
        "the optimizer step goes through SendGradSquares and FinishStep");
  }
  if (op.micro_batch < placement_.micro_batch_begin ||
      op.micro_batch >= placement_.local_end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", placement_.index, ": op ", ToString(op),
                     " names no micro-batch of [", placement_.micro_batch_begin,
                     ", ", placement_.local_end(), ")"));
  }
  OnStage on_stage(*this);
  switch (op.kind) {
    case OpKind::kForward:
      return Forward(st.step, op.micro_batch, st.batch, st.ranges,
                     st.result.loss_normalizer, st.flight, st.result);
    case OpKind::kBackward:
    case OpKind::kBackwardInput:
      return Backward(st.step, op.micro_batch, op.kind, st.flight);
    case OpKind::kBackwardWeight:
      return BackwardWeight(st.step, op.micro_batch, st.flight);
    case OpKind::kReceiveActivation:
    case OpKind::kReceiveGradient:
      return Receive(st.step, op.micro_batch, op.kind, st.flight);
    case OpKind::kSendActivation:
    case OpKind::kSendGradient:
      return Send(st.step, op.micro_batch, op.kind, st.flight);
    case OpKind::kOptimizerStep:
      break;
  }
  return absl::InternalError("unknown op kind");
}

absl::StatusOr<size_t> Stage::RunOps(std::span<const Op> ops) {
  if (ops.empty()) return 0;
  const Op& first = ops[0];
  const int64_t m0 = first.micro_batch;
  if (first.kind != OpKind::kBackwardWeight || !current_ ||
      m0 < placement_.micro_batch_begin || m0 >= placement_.local_end() ||
      current_->flight[m0].deferred.empty() ||
      current_->flight[m0].weight_waits) {
    RETURN_IF_ERROR(RunOp(first));
    return 1;
  }
  StepState& st = *current_;
  const int64_t most = WeightGroupSize(st, m0, /*whole=*/false);
  // The next micro-batches' weight halves, each waiting for it, within the
  // gradient group (whose sum is pushed after its last).
  std::vector<int64_t> members = {m0};
  for (size_t i = 1; i < ops.size(); ++i) {
    const int64_t m = m0 + static_cast<int64_t>(i);
    const Op& op = ops[i];
    if (static_cast<int64_t>(members.size()) >= most ||
        op.kind != OpKind::kBackwardWeight || op.chunk != first.chunk ||
        op.micro_batch != m || m >= placement_.local_end() ||
        m % placement_.group_size() == 0 || st.flight[m].deferred.empty() ||
        st.flight[m].weight_waits) {
      break;
    }
    members.push_back(m);
  }
  if (members.size() == 1) {
    RETURN_IF_ERROR(RunOp(first));
    return 1;
  }
  OnStage on_stage(*this);
  RETURN_IF_ERROR(SettleWeights(st, m0 - 1, /*open=*/true));
  RETURN_IF_ERROR(RunWeights(st, members, /*every_layer=*/true));
  for (const int64_t m : members) RETURN_IF_ERROR(WeightGradientDone(m));
  return members.size();
}

absl::StatusOr<StageStepResult> Stage::RunStep(int64_t step) {
  RETURN_IF_ERROR(BeginStep(step));
  // On an error the step's records go with it, not into the next step.
  absl::Cleanup forget = [this] { current_.reset(); };
  const std::span<const Op> ops(schedule_);
  for (size_t i = 0; i < ops.size();) {
    if (ops[i].kind != OpKind::kOptimizerStep) {
      ASSIGN_OR_RETURN(const size_t ran, RunOps(ops.subspan(i)));
      i += ran;
      continue;
    }
    RETURN_IF_ERROR(SendGradSquares());
    return FinishStep();
  }
  return absl::InternalError(absl::StrCat(
      "stage ", placement_.index, ": the schedule has no optimizer step",
      Interleaves(placement_.schedule)
          ? " (an interleaved schedule's stages run op by op, by their worker)"
          : ""));
}

}  // namespace gpipe
