#include "services/pipeline/step_plan.h"

namespace gpipe {

StepPlan StepPlan::FromSpec(const gpipe::v1::JobSpec& spec) {
  return StepPlan(spec.steps(), spec.checkpoint().every(), spec.eval().every());
}

}  // namespace gpipe
