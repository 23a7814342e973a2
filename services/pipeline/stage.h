// One pipeline stage: a contiguous range of layers, its optimizer, and the
// runtime that executes the stage's schedule for a step against its links.
// The first stage reads inputs and the last reads targets from the same
// deterministic sampler, so labels never travel through the pipe.
#ifndef GPIPE_SERVICES_PIPELINE_STAGE_H_
#define GPIPE_SERVICES_PIPELINE_STAGE_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/data/batch_prefetch.h"
#include "services/data/dataset.h"
#include "services/data/sampler.h"
#include "services/nn/layer_timing.h"
#include "services/nn/loss.h"
#include "services/nn/model.h"
#include "services/nn/optimizer.h"
#include "services/pipeline/gradient_reducer.h"
#include "services/pipeline/gradient_tree.h"
#include "services/pipeline/micro_batch.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/timeline.h"
#include "services/pipeline/trainer.h"
#include "services/tensor/device_transfer.h"
#include "services/tensor/shape.h"
#include "services/transport/link.h"

namespace gpipe {

// Where a stage sits in its pipeline and how it runs.
struct StagePlacement {
  int64_t index = 0;        // 0-based
  int64_t count = 1;        // K
  int64_t layer_begin = 0;  // global layer range [begin, end)
  int64_t layer_end = 0;
  int64_t micro_batches = 1;  // M
  ScheduleKind schedule = ScheduleKind::kGPipe;
  // The ops of a step instead of MakeSchedule's when not empty: tests run
  // broken schedules to show the exactness checks catch them. A list
  // without transfers gets them (WithTransfers); one with them runs as
  // written, and a send left out leaves its neighbour waiting for ever (run
  // such a list through Simulate first). Micro-batches outside [0, M) are
  // refused.
  std::vector<Op> ops;
  RematMode remat = RematMode::kExceptLast;
  // Where the stage computes; links carry host tensors unless they say
  // they carry device tensors (Link::CarriesDeviceTensors).
  Device device = Device::kCpu;
  // >= 1: every layer takes this many times as long (LayerTiming): a
  // worker standing for a slower machine in tests and benchmarks.
  double compute_slowdown = 1.0;
  // Data-parallel replicas (pipeline.replicas): this stage runs the
  // micro-batches [micro_batch_begin, micro_batch_end) of each step's M
  // (end 0: M), its gradients sum over `gradient_groups` groups in
  // GradientTree's order, and with a `reducer` (several replicas) across
  // the replicas of the stage, replica `replica` being this one.
  int64_t gradient_groups = 1;
  int64_t micro_batch_begin = 0;
  int64_t micro_batch_end = 0;
  int64_t replica = 0;
  GradientReducer* reducer = nullptr;

  bool first() const { return index == 0; }
  bool last() const { return index == count - 1; }
  int64_t local_end() const {
    return micro_batch_end > 0 ? micro_batch_end : micro_batches;
  }
  int64_t local_micro_batches() const {
    return local_end() - micro_batch_begin;
  }
  // Micro-batches per gradient group (gradient_groups must divide M).
  int64_t group_size() const { return micro_batches / gradient_groups; }
};

// How Stage::RunEval failed, where every stage ended its evaluation alike
// (each told its neighbours), as against a lost link: this stage's own
// part failed, or another stage's did. Mark: what a caller that turns an
// exception RunEval threw into a status adds (RunEval told the neighbours).
bool EvalFailedHere(const absl::Status& s);
bool EvalEndedElsewhere(const absl::Status& s);
absl::Status MarkEvalFailedHere(absl::Status s);

// What a stage reports after a step. Loss figures are the last stage's.
struct StageStepResult {
  int64_t step = 0;
  LossResult loss;
  // The last stage's loss of each micro-batch it ran, by micro-batch
  // (others empty): replicas' losses add up in micro-batch order.
  std::vector<LossResult> losses;
  double loss_normalizer = 1.0;
  double grad_norm = 0.0;
  float lr = 0.0f;
  int64_t peak_activation_bytes = 0;
};

class Stage {
 public:
  // Whether an optimizer update began and did not end (a cancel or an
  // allocation failure inside it): the parameters are then torn between
  // two steps and must not be kept.
  bool update_in_progress() const { return update_in_progress_; }
  // The step whose gradients are final (summed over micro-batches, groups
  // and replicas) and whose update waits only for the pipeline's total of
  // squared gradients; -1 when none does. A stage cut off there can be
  // rolled forward (RollForward) once another stage tells that total.
  int64_t pending_update() const { return pending_update_; }
  // The last update this stage applied: its step (-1: none) and the
  // pipeline's total of squared gradients it clipped with, the same on
  // every stage and replica.
  int64_t last_update_step() const { return last_update_step_; }
  double last_update_squares() const { return last_update_squares_; }
  // The step's batch norm statistics of every micro-batch (rows of
  // Model::RunningStatisticsRows, gathered from the replicas) while the
  // update of pending_update() waits; undefined otherwise, and for a stage
  // without running averages to move.
  Tensor pending_running_statistics() const;
  // Sets the parameters' gradients to `grads` (by name, as
  // model().Parameters() names them) and applies the update of `step` with
  // the pipeline's total `squares`, and the running averages' moves by
  // `running_statistics` (pending_running_statistics() then), as
  // FinishStep would have: the same bits.
  absl::Status RollForward(int64_t step, double squares,
                           const std::map<std::string, Tensor>& grads,
                           const Tensor& running_statistics = Tensor());

  // `dataset` is read by the first and the last stage (others may pass
  // null). The links are not owned; the first stage has no upstream and the
  // last no downstream.
  static absl::StatusOr<std::unique_ptr<Stage>> Create(
      const gpipe::v1::JobSpec& spec, const StagePlacement& placement,
      std::shared_ptr<const Dataset> dataset, Link* upstream, Link* downstream,
      Timeline::Clock::time_point origin = Timeline::Clock::now());

  // Runs the schedule of training step `step` and the optimizer step.
  absl::StatusOr<StageStepResult> RunStep(int64_t step);

  // The same step op by op, for a worker that runs several stages (the
  // chunks of an interleaved schedule) on one thread: BeginStep, RunOp for
  // each op of its list with the transfers (WithTransfers), then the
  // optimizer step in two halves,
  // SendGradSquares (the clipping norm passed down the chain) on every
  // chunk in chunk order and FinishStep (the total passed back up, the
  // update) in reverse, so no chunk waits for one its own thread has not
  // reached. RunStep is these calls in its schedule's order.
  absl::Status BeginStep(int64_t step);
  absl::Status RunOp(const Op& op);
  // RunOp of ops[0] and, when it is a weight half, of the weight halves of
  // the next micro-batches of the same chunk that follow it at once, as one
  // group (Model::BackwardWeights; the same bits, each gradient read and
  // written once); returns how many ops it ran.
  absl::StatusOr<size_t> RunOps(std::span<const Op> ops);
  absl::Status SendGradSquares();
  absl::StatusOr<StageStepResult> FinishStep();
  // A forward-only pass over a split in batches of the evaluation batch
  // size; the last stage returns the loss and accuracy, others zeros.
  // With `outputs` (the last stage's), the model's output of each batch is
  // appended there as a host tensor, in order: what predict returns.
  // When this stage's own part fails (its compute, its data, a batch it
  // cannot take; not a link), it tells both neighbours, which end theirs
  // and pass it on, so every stage returns at once with its links still
  // up: EvalFailedHere here (an exception, such as running out of memory,
  // is thrown on after telling them), EvalEndedElsewhere on the others.
  absl::StatusOr<LossResult> RunEval(Split split, int64_t max_samples,
                                     std::vector<Tensor>* outputs = nullptr);

  const StagePlacement& placement() const { return placement_; }
  Model& model() { return *model_; }
  Optimizer& optimizer() { return *optimizer_; }
  const Timeline& timeline() const { return timeline_; }
  // Peak bytes this stage's allocator held during the last step.
  int64_t peak_activation_bytes() const { return last_peak_bytes_; }
  // Seconds the last step spent summing its gradient groups and replicas
  // (SumGradientGroups: waiting for the other replicas included); 0 with
  // one group.
  double reduce_seconds() const { return last_reduce_seconds_; }
  // Peak bytes the same allocator held during the last RunEval.
  int64_t peak_evaluation_bytes() const { return last_eval_peak_bytes_; }
  // Each layer's running forward and backward seconds per micro-batch
  // (LayerTiming); null on a GPU, whose kernels the host clock cannot time.
  const LayerTiming* layer_timing() const {
    return device_ == nullptr ? &layer_timing_ : nullptr;
  }

 private:
  Stage(const gpipe::v1::JobSpec& spec, const StagePlacement& placement,
        Timeline::Clock::time_point origin);

  absl::StatusOr<LossResult> RunEvalBatches(Split split, int64_t max_samples,
                                            std::vector<Tensor>* outputs);
  // Waits for the next stage's receipt of evaluation batch b (RunEval).
  absl::Status AwaitEvalTaken(int64_t b);
  // Tells the neighbours (but `except`) that stage `origin`'s part of the
  // evaluation failed; a neighbour already gone is skipped.
  void TellEvalFailed(int64_t origin, const Link* except);
  // `in` (kEvalFailed, from `from`) passed on to the other neighbour; the
  // status RunEval returns for it.
  absl::Status EndedElsewhere(const Message& in, const Link* from);
  // A send to `link` failed: EndedElsewhere when the neighbour had told this
  // stage of a failure before it let go, else `failed` as a lost link's.
  absl::Status AfterFailedSend(Link* link, absl::Status failed);

  // Per micro-batch state between its forward and its backward (with a
  // split backward: until its weight half).
  struct InFlight {
    Tensor input;              // kept under re-materialization
    std::vector<Saved> saved;  // kept without it
    Tensor dlogits;            // last stage: gradient of the loss
    // Between the input half and the weight half: what the weight half
    // reads besides `saved` (Model::BackwardInput).
    std::vector<Saved> deferred;
    // The schedule's transfers: what a receive took off its link for the
    // op it serves, and what an op made for the send after it.
    Tensor activation_in, gradient_in;
    Tensor activation_out, gradient_out;
    // What made gradient_out (a whole backward or an input half), for the
    // send's record.
    Phase gradient_phase = Phase::kBackward;
    // A whole backward's group push (WeightGradientDone), run once its
    // input gradient is sent: the stage upstream waits for that, not for
    // the group's sum.
    bool weights_due = false;
    // A whole backward whose weight half waits for its group
    // (Model::BackwardGrouping); and on a group's last, the group, which
    // its send runs once the input gradient is out.
    bool weight_waits = false;
    std::vector<int64_t> weight_group_due;

    // After an input half, or a whole backward whose weight half waits:
    // only what the weight half reads stays (saved, deferred).
    void KeepWeightOperands() {
      input = Tensor();
      dlogits = Tensor();
    }
    // The backward's record goes; the transfers' slots stay.
    void Release() {
      input = Tensor();
      saved.clear();
      dlogits = Tensor();
      deferred.clear();
      weight_waits = false;
    }
  };

  absl::StatusOr<Message> Expect(Link* link, MessageKind kind, int64_t step,
                                 int64_t micro_batch);
  // InvalidArgument unless `t`, micro-batch `m`'s activation from the
  // upstream stage (or gradient from the downstream one), is float32 of
  // this stage's input (output) shape per sample, with `rows` rows, or
  // between 1 and `max_rows` when `rows` is 0 (an evaluation batch). A
  // neighbour's tensor of another shape was read past its end.
  absl::Status CheckArrived(const Tensor& t, bool activation, int64_t m,
                            int64_t rows, int64_t max_rows) const;
  absl::Status Forward(int64_t step, int64_t m, const Batch& batch,
                       const std::vector<RowRange>& ranges, double normalizer,
                       std::vector<InFlight>& flight, StageStepResult& result);
  // The whole backward (kBackward) or its input half (kBackwardInput),
  // which leaves the input gradient for its send either way.
  absl::Status Backward(int64_t step, int64_t m, OpKind kind,
                        std::vector<InFlight>& flight);
  // FAILED_PRECONDITION when a forward (or a backward, or input half) of
  // micro-batch m would run without what its receive takes, or before its
  // last output went out.
  absl::Status CheckTransfersAround(bool forward, int64_t m,
                                    const InFlight& f) const;
  // A schedule's receive and send actions (OpKind's transfers).
  absl::Status Receive(int64_t step, int64_t m, OpKind kind,
                       std::vector<InFlight>& flight);
  absl::Status Send(int64_t step, int64_t m, OpKind kind,
                    std::vector<InFlight>& flight);
  // FAILED_PRECONDITION naming what the step's schedule received and did
  // not use, or made and did not send (a broken hand-made schedule).
  absl::Status CheckTransfersDone() const;
  // FAILED_PRECONDITION when micro-batch m has no input half waiting for
  // it (a schedule running a weight half twice, or before its input half).
  absl::Status BackwardWeight(int64_t step, int64_t m,
                              std::vector<InFlight>& flight);
  // After micro-batch m's parameter gradients are in: a group's last
  // micro-batch hands the group to the step's GradientTree.
  absl::Status WeightGradientDone(int64_t m);
  // Before the clipping norm: the gradients summed over the groups and the
  // replicas (GradientTree, GradientReducer); nothing with one group.
  absl::Status SumGradientGroups();
  // After the sum: every micro-batch's batch norm statistics, from this
  // stage's records and its replicas' (GradientReducer::GatherRows), for
  // the update to move the running averages by; nothing without any.
  absl::Status GatherRunningStatistics();
  // This stage's groups, [first, end).
  int64_t first_group() const;
  int64_t local_groups() const;
  LayerContext Context(int64_t step, int64_t m) const;
  // The allocator that counts this stage's tensors (the device's on a GPU).
  CountingAllocator& Counted() {
    return device_ != nullptr ? device_->activations() : activations_;
  }
  // While alive, tensors go to this stage: its counting allocator and, on
  // a GPU, its device and streams.
  struct OnStage {
    explicit OnStage(Stage& s)
        : host(&s.activations_), device(s.device_.get()) {}
    AllocatorScope host;
    DeviceTransfer::Scope device;
  };
  // The clipping chain's message: the squared norm so far, or the total.
  static Message GradSquares(int64_t step, double squares);

  // A step between BeginStep and FinishStep.
  struct StepState {
    int64_t step = 0;
    Batch batch;
    std::vector<RowRange> ranges;
    std::vector<InFlight> flight;
    StageStepResult result;
    double squares = 0;        // the clipping chain's sum so far
    GradientTree groups;       // with several gradient groups per stage
    int64_t next_weight = -1;  // the micro-batch whose weights are due
    // Whole backwards whose weight halves wait to run as one group
    // (Model::BackwardGrouping), in the order they ran; and how many
    // micro-batches a group takes (WeightGroupSize; 0 until known).
    std::vector<int64_t> weight_group;
    int64_t weight_group_size = 0;
    int64_t weights_done = 0;  // micro-batches whose weight gradients ran
    // No micro-batch below this one has a push or a group due at its send
    // (SettleWeights starts here: every send and backward settles).
    int64_t settled_below = 0;
    // Overlap: the reducer summing this step's buckets (null when none
    // runs), the bucket being gathered (parameters [bucket_begin,
    // bucket_end), bucket_bytes of gradients), buckets handed in, and the
    // first failure to hand one in.
    GradientReducer* summing = nullptr;
    int64_t bucket_begin = 0, bucket_end = 0, bucket_bytes = 0, buckets = 0;
    absl::Status bucket_status;
    // Batch norm's statistics of this stage's micro-batches, held back to
    // the step's end (a cancelled step then leaves the running averages
    // at the last step boundary, and replicas move them by every
    // micro-batch in order), and after the sum every micro-batch's rows.
    RunningStatistics running_log;
    Tensor running_rows;
    // A GPU stage's sum goes through host copies of its gradients: the
    // copies, which the reducer overwrites with the totals, and the device
    // gradients they go back to once every bucket is summed.
    std::vector<std::unique_ptr<Parameter>> host_grads;
    std::vector<Tensor> device_grads;
    StepState() = default;
    StepState(const StepState&) = delete;
    StepState& operator=(const StepState&) = delete;
    // A step abandoned with buckets in flight: they must not write into
    // the gradients after the stage moved on (or was freed).
    ~StepState() {
      if (summing != nullptr) {
        summing->Close();
        (void)summing->FinishBuckets();
      }
    }
  };
  // The after-layer callback of the weight gradients about to run (a whole
  // backward or a weight half) when they are the step's last and hand the
  // parameters' gradients to the reducer in buckets as their layers finish
  // them (replicas over a reducer that takes buckets, one gradient group
  // per replica); null otherwise.
  // `count`: the micro-batches whose weight gradients are about to run.
  std::function<void(int64_t)> Bucketer(StepState& st, int64_t count = 1);
  // How many micro-batches' weight halves this stage groups (Model::
  // WeightGroupSize of micro-batch m's record, within a gradient group),
  // decided once a step; 1 on a GPU. After `whole` backwards, also 1 under
  // re-materialization: the group would hold again the activations the
  // stage gives up time not to hold (the weight halves of split backwards
  // hold theirs anyway), and unless one group takes a gradient group
  // (WholeBackwardsGroupSize).
  int64_t WeightGroupSize(StepState& st, int64_t m, bool whole);
  // The weight halves of `members` as one group (Model::BackwardWeights):
  // after their input halves (`every_layer`) or their whole backwards
  // grouping. Records one kBackwardWeight op each, the group's time shared
  // out, and lets go of their records; the caller runs WeightGradientDone.
  absl::Status RunWeights(StepState& st, std::span<const int64_t> members,
                          bool every_layer);
  // A group of whole backwards' weight halves (`members`, taken from
  // StepState::weight_group), each member's WeightGradientDone after it.
  absl::Status RunWeightGroup(StepState& st, std::vector<int64_t> members);
  // What whole backwards of micro-batches up to `through` left for their
  // sends (WeightGradientDone, a closed group), in micro-batch order, and
  // with `open` the group still open: before anything that adds gradients
  // later micro-batches' must follow.
  absl::Status SettleWeights(StepState& st, int64_t through, bool open);
  // After layer `layer` (local) of the last backward: adds its parameters
  // to the bucket and hands the bucket in once it is large enough or the
  // layers are done.
  void BucketLayer(StepState& st, int64_t layer);
  // A GPU stage's sum with its replicas, through host copies: `params`
  // with each gradient replaced by a host copy (kept in `st`), and the
  // copies (the totals by then) back into the device gradients.
  std::vector<NamedParameter> MirrorOnHost(std::vector<NamedParameter> params,
                                           StepState& st);
  void ReturnToDevice(StepState& st);
  // `t` as `link` takes it: on the host, or as it is.
  Tensor ForLink(Link* link, Tensor t);

  gpipe::v1::JobSpec spec_;
  StagePlacement placement_;
  // What arrives from the neighbours, per sample: the activation of this
  // stage's first layer's input and the gradient of its last layer's
  // output; and each training micro-batch's rows.
  Shape input_sample_;
  Shape output_sample_;
  std::vector<RowRange> micro_batch_rows_;
  bool remat_;
  std::vector<Op> schedule_;
  std::shared_ptr<const Dataset> dataset_;
  std::unique_ptr<Sampler> sampler_;
  // The first and the last stage's next batch (or its targets), gathered
  // while the step before runs; null on the other stages.
  std::unique_ptr<BatchPrefetch> prefetch_;
  Link* upstream_ = nullptr;
  Link* downstream_ = nullptr;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  // Through the process's allocator, so a worker's memory limit
  // (TensorMemoryLimit) sees the stage's activations too.
  CountingAllocator activations_{DefaultCpuAllocator()};
  // Streams, device allocator and pinned staging of a GPU stage; null on
  // the CPU.
  std::unique_ptr<DeviceTransfer> device_;
  Timeline timeline_;
  LayerTiming layer_timing_;
  int64_t last_peak_bytes_ = 0;
  bool update_in_progress_ = false;
  int64_t pending_update_ = -1;
  Tensor pending_running_rows_;  // with pending_update_
  int64_t last_update_step_ = -1;
  double last_update_squares_ = 0;
  // Moves the running averages by `running_rows` (when defined), clips by
  // `squares` and applies the optimizer's update of `step`; returns the
  // learning rate.
  absl::StatusOr<float> ApplyUpdate(int64_t step, double squares,
                                    const Tensor& running_rows);
  // Whether training forwards hold batch norm's statistics back to the
  // step's end (a CPU stage with running averages).
  bool holds_back_statistics_ = false;
  int64_t last_eval_peak_bytes_ = 0;
  double last_reduce_seconds_ = 0;
  // Model::Parameters() index of each local layer's first parameter, and
  // the count at the end (filled on first use).
  std::vector<int64_t> layer_params_;
  std::unique_ptr<StepState> current_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_STAGE_H_
