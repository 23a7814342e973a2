// Which steps of a job end with a checkpoint or an evaluation: the one rule
// the stages (which run them), the reference trainer and the controller
// (which checks the reports) agree on. Both happen after a step completes,
// every `every` steps, but never after the last step: the final parameters
// and the final evaluation cover it.
#ifndef GPIPE_SERVICES_PIPELINE_STEP_PLAN_H_
#define GPIPE_SERVICES_PIPELINE_STEP_PLAN_H_

#include <cstdint>

#include "gpipe/v1/job.pb.h"

namespace gpipe {

class StepPlan {
 public:
  StepPlan(int64_t steps, int64_t checkpoint_every, int64_t eval_every)
      : steps_(steps),
        checkpoint_every_(checkpoint_every),
        eval_every_(eval_every) {}
  static StepPlan FromSpec(const gpipe::v1::JobSpec& spec);

  int64_t steps() const { return steps_; }
  int64_t checkpoint_every() const { return checkpoint_every_; }
  int64_t eval_every() const { return eval_every_; }

  // Whether a checkpoint follows once `done` steps have completed.
  bool CheckpointsAfter(int64_t done) const {
    return Periodic(checkpoint_every_, done);
  }
  // Whether an evaluation on the test split follows once `done` steps have
  // completed (the final one is separate).
  bool EvaluatesAfter(int64_t done) const {
    return Periodic(eval_every_, done);
  }

 private:
  bool Periodic(int64_t every, int64_t done) const {
    return every > 0 && done > 0 && done < steps_ && done % every == 0;
  }

  int64_t steps_;
  int64_t checkpoint_every_;
  int64_t eval_every_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_STEP_PLAN_H_
