// What the CLI (and later the worker) drives: something that trains a job
// step by step. The single-process reference trainer and the in-process
// pipeline implement it, and must produce bitwise the same parameters.
#ifndef GPIPE_SERVICES_PIPELINE_TRAINER_H_
#define GPIPE_SERVICES_PIPELINE_TRAINER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"
#include "services/data/dataset.h"
#include "services/nn/model.h"

namespace gpipe {

struct StepReport {
  int64_t step = 0;       // 0-based index of the step just taken
  double loss = 0.0;      // mean over the mini-batch
  double accuracy = 0.0;  // of the mini-batch's counted targets
  float lr = 0.0f;
  // Global, before clipping; 0 when the job does not clip (ClipsGradients:
  // the norm is then not computed).
  double grad_norm = 0.0;
};

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t counted = 0;  // targets evaluated
};

class Trainer {
 public:
  virtual ~Trainer() = default;
  // Trains step number step() and advances. FAILED_PRECONDITION on a loss
  // that is not finite.
  virtual absl::StatusOr<StepReport> Step() = 0;
  // Mean loss and accuracy over a split (at most `max_samples`, 0: all).
  virtual absl::StatusOr<EvalResult> Evaluate(Split split,
                                              int64_t max_samples) = 0;
  virtual int64_t step() const = 0;
  // Parameters and buffers of the whole model by global name.
  virtual std::vector<NamedTensor> StateTensors() = 0;
  // What init_from loaded ("loaded 12 tensors; ..."), empty without it.
  virtual const std::string& init_summary() const = 0;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_TRAINER_H_
