// The single-process reference trainer: every mini-batch is split into M
// micro-batches whose gradients accumulate in a fixed order (0..M-1, and
// with several gradient groups, the groups' sums in GradientTree's order),
// so each pipelined run can be compared with it bit for bit.
#ifndef GPIPE_SERVICES_PIPELINE_REFERENCE_TRAINER_H_
#define GPIPE_SERVICES_PIPELINE_REFERENCE_TRAINER_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/data/batch_prefetch.h"
#include "services/data/dataset.h"
#include "services/data/sampler.h"
#include "services/nn/model.h"
#include "services/nn/optimizer.h"
#include "services/pipeline/trainer.h"

namespace gpipe {

class ReferenceTrainer final : public Trainer {
 public:
  // Opens the data, builds and initializes the model and optimizer.
  // `micro_batches` overrides the spec's M when > 0.
  // `dataset`, when given, is used instead of opening the spec's (tests
  // share one across many runs). `device` is where the model computes
  // (inputs are copied to it; the CPU keeps the bitwise contract).
  static absl::StatusOr<std::unique_ptr<ReferenceTrainer>> Create(
      const gpipe::v1::JobSpec& spec, int64_t micro_batches = 0,
      std::shared_ptr<const Dataset> dataset = nullptr,
      Device device = Device::kCpu);

  absl::StatusOr<StepReport> Step() override;
  absl::StatusOr<EvalResult> Evaluate(Split split,
                                      int64_t max_samples = 0) override;
  int64_t step() const override { return step_; }
  std::vector<NamedTensor> StateTensors() override {
    return model_->StateTensors();
  }
  const std::string& init_summary() const override { return init_summary_; }
  int64_t micro_batches() const { return micro_batches_; }
  // Where the model and its micro-batches live.
  Device device() const { return device_; }
  const gpipe::v1::JobSpec& spec() const { return spec_; }
  Model& model() { return *model_; }
  Optimizer& optimizer() { return *optimizer_; }
  const Dataset& dataset() const { return *dataset_; }
  // How many steps' batches were gathered while the step before ran.
  int64_t batches_taken_ahead() const { return prefetch_->taken_ahead(); }

 private:
  ReferenceTrainer() = default;

  gpipe::v1::JobSpec spec_;
  int64_t micro_batches_ = 1;
  int64_t groups_ = 1;  // gradient groups (GradientTree)
  Device device_ = Device::kCpu;
  int64_t step_ = 0;
  std::shared_ptr<const Dataset> dataset_;
  std::unique_ptr<Sampler> sampler_;
  // After the dataset and sampler it reads, so it stops before they go.
  // The next step's batch is gathered while this one runs: on a GPU the
  // gather is host work the device would otherwise wait for.
  std::unique_ptr<BatchPrefetch> prefetch_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::string init_summary_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_REFERENCE_TRAINER_H_
