// K stages on K threads of this process, joined by in-process links: the
// whole GPipe machinery (schedules, re-materialization, exact gradients)
// without a network. The gRPC cluster swaps only the links.
#ifndef GPIPE_SERVICES_PIPELINE_IN_PROCESS_PIPELINE_H_
#define GPIPE_SERVICES_PIPELINE_IN_PROCESS_PIPELINE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/pipeline/remat.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/stage.h"
#include "services/pipeline/stage_thread.h"
#include "services/pipeline/trainer.h"
#include "services/transport/link.h"

namespace gpipe {

struct PipelineOptions {
  // K workers (threads); each holds one stage, or under an interleaved
  // schedule `virtual_stages` of the K x v stages. 0: the spec's.
  int64_t stages = 0;
  int64_t virtual_stages = 0;  // v; 0: the spec's
  int64_t micro_batches = 0;   // M; 0: the spec's
  // R data-parallel copies of the pipeline, each on its own K threads; 0:
  // the spec's. The gradient groups are the spec's (0 there: R).
  int64_t replicas = 0;
  // The replicas of a stage sum their gradients over links between them
  // (LinkReduction, as worker processes would) instead of in memory.
  bool reduce_over_links = false;
  ScheduleKind schedule = ScheduleKind::kGPipe;
  RematMode remat = RematMode::kExceptLast;
  // Layers per stage (K x v of them, in model order); empty: partitioner.
  std::vector<int64_t> balance;
  int threads_per_stage = 1;
  Device device = Device::kCpu;  // where every stage computes
  // Used instead of opening the spec's dataset when set (tests share one).
  std::shared_ptr<const Dataset> dataset;
  // Each stage's ops instead of the schedule's, when given (K lists): tests
  // that a broken schedule cannot go unnoticed (StagePlacement::ops).
  std::vector<std::vector<Op>> ops;
};

// The options a spec asks for (stages, micro-batches, schedule, remat).
PipelineOptions OptionsFromSpec(const gpipe::v1::JobSpec& spec);

class InProcessPipeline final : public Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessPipeline>> Create(
      const gpipe::v1::JobSpec& spec, const PipelineOptions& options);
  ~InProcessPipeline() override;

  absl::StatusOr<StepReport> Step() override;
  absl::StatusOr<EvalResult> Evaluate(Split split,
                                      int64_t max_samples) override;
  int64_t step() const override { return step_; }
  // The model's outputs for the first `max_samples` (0: all) of a split,
  // batch by batch through every stage (forward only), concatenated:
  // [N, output...] on the host.
  absl::StatusOr<Tensor> Outputs(Split split, int64_t max_samples);
  std::vector<NamedTensor> StateTensors() override;
  const std::string& init_summary() const override { return init_summary_; }

  // The stages of one replica (K, or K x v chunks) and replica r's stage
  // i; evaluation, outputs and state come from replica 0.
  int64_t stage_count() const { return chunks_; }
  int64_t replica_count() const { return replicas_; }
  // K workers of v chunks each under `schedule()` (StageOfChunk places
  // them); v is 1 unless the schedule interleaves.
  int64_t worker_count() const { return workers_; }
  int64_t chunks_per_worker() const { return virtual_stages_; }
  ScheduleKind schedule() const { return schedule_; }
  RematMode remat() const { return remat_; }
  Stage& stage(int64_t i, int64_t replica = 0) {
    return *stages_[replica * chunks_ + i];
  }
  const std::vector<int64_t>& balance() const { return balance_; }
  // The phase times ZB-V's order was built for (the cost model's); empty
  // under the other schedules.
  const std::vector<PhaseTicks>& order_ticks() const { return order_ticks_; }
  const Dataset& dataset() const { return *dataset_; }

 private:
  InProcessPipeline() = default;
  // Runs `work(i)` on threads 0..n-1 at once. On the first error the links
  // are closed so no stage waits forever for a dead neighbour.
  template <typename Result, typename Work>
  absl::StatusOr<std::vector<Result>> OnThreads(size_t n, Work work);
  // `work(stage)` on every stage's thread: replica 0's, or every
  // replica's.
  template <typename Result, typename Work>
  absl::StatusOr<std::vector<Result>> OnAllStages(Work work,
                                                  bool all_replicas = false);
  // Closes every link and reduction, so no thread waits for a failed one.
  void CloseAll();
  // One training step of worker w of an interleaved pipeline: its chunks'
  // ops in the worker's order on one thread; results by chunk.
  absl::StatusOr<std::vector<StageStepResult>> RunWorkerStep(int64_t w,
                                                             int64_t step);

  gpipe::v1::JobSpec spec_;
  std::vector<int64_t> balance_;
  std::shared_ptr<const Dataset> dataset_;
  std::vector<std::unique_ptr<Link>> links_;  // 2 per neighbouring pair
  // Per stage of a replica: its replicas' meeting point (R > 1).
  std::vector<std::unique_ptr<GradientReducer>> reducers_;
  // R x (K x v): replica r's stages from r x chunks_, in model order.
  std::vector<std::unique_ptr<Stage>> stages_;
  int64_t chunks_ = 1;          // K x v
  int64_t replicas_ = 1;        // R
  int64_t workers_ = 1;         // K
  int64_t virtual_stages_ = 1;  // v
  ScheduleKind schedule_ = ScheduleKind::kGPipe;
  RematMode remat_ = RematMode::kExceptLast;
  std::vector<std::vector<Op>> worker_ops_;  // interleaved: per worker
  std::vector<PhaseTicks> order_ticks_;      // ZB-V's (order_ticks())
  std::vector<std::unique_ptr<StageThread>> threads_;
  int64_t step_ = 0;
  bool broken_ = false;
  std::string init_summary_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_IN_PROCESS_PIPELINE_H_
