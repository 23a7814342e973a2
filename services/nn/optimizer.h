// Optimizers (SGD with momentum and weight decay, AdamW), the learning-rate
// schedule and global-norm gradient clipping. Each stage steps only its own
// parameters; results match the single process because every parameter's
// update depends only on itself and the clipping coefficient.
#ifndef GPIPE_SERVICES_NN_OPTIMIZER_H_
#define GPIPE_SERVICES_NN_OPTIMIZER_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/nn/model.h"

namespace gpipe {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update with learning rate `lr`; `step` counts from 1.
  // `updated(i)`, when given, runs once parameter i (in the order the
  // optimizer was made with) has its new value, while it is still in the
  // cache (Model::PackAfterUpdate).
  virtual void Step(float lr, int64_t step,
                    const std::function<void(size_t)>& updated = nullptr) = 0;
  // Optimizer state by name ("<param name>.momentum", ".exp_avg", ...), for
  // checkpoints.
  virtual std::vector<NamedTensor> State() = 0;
};

// Makes the optimizer of `spec` over `params` (which must outlive it).
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(
    const gpipe::v1::OptimizerSpec& spec, std::vector<NamedParameter> params);

// The learning rate for `step` (0-based) of `total_steps`: linear warm-up,
// then constant, cosine or linear decay to min_lr.
float LearningRate(const gpipe::v1::OptimizerSpec& spec, int64_t step,
                   int64_t total_steps);

// running + the squared L2 norm of every gradient, folded parameter by
// parameter in order. Stages chain it (stage i starts from stage i-1's
// value), so the pipelined sum is bitwise the single-process sum.
double AccumulateGradSquares(const std::vector<NamedParameter>& params,
                             double running);
// The same in two halves: each gradient's squared L2 norm, and their fold
// into `running` in order (bitwise AccumulateGradSquares), so a stage can
// sum its own before the running sum from upstream arrives.
std::vector<double> GradSquaresByParameter(
    const std::vector<NamedParameter>& params);
double FoldGradSquares(const std::vector<double>& by_parameter, double running);

// Whether the spec clips gradients by their global norm. Only then is the
// norm summed: nothing else reads it, and the sum is a pass over every
// gradient (a tenth of an update's memory traffic with SGD and momentum),
// which PyTorch, too, makes only in clip_grad_norm_. Without clipping the
// trainers take 0 for the squares, and the stages still pass that total
// down the pipe and back, where it is the barrier before the update.
bool ClipsGradients(const gpipe::v1::OptimizerSpec& spec);

// The factor gradients are scaled by so their global norm is at most
// `clip_norm` (1 when clipping is off or not needed).
float ClipCoefficient(double grad_squares, float clip_norm);
void ScaleGradients(const std::vector<NamedParameter>& params, float factor);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_NN_OPTIMIZER_H_
