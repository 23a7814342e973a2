// The bubble a running cut's own stage times explain. The cost model
// prices every layer on a nominal machine, and some layers run far from
// it (a convolution of one input channel is a product of depth 9): for
// the Fashion-MNIST CNN cut 1,1,2,9 it predicted 91% 96% 98% 4% where the
// stages measured 74% 80% 71% 30%. Simulating the schedule on the times
// the stages measure instead leaves, in the measured bubble's excess,
// what the cut does not explain: slow links, waits, a disturbed worker.
#ifndef GPIPE_SERVICES_PIPELINE_MEASURED_CUT_H_
#define GPIPE_SERVICES_PIPELINE_MEASURED_CUT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "services/pipeline/simulator.h"
#include "services/pipeline/timeline.h"

namespace gpipe {

// A stage's costs per micro-batch (`micro_batches` M a step) from the
// steps its timeline kept: each phase's median over the steps (the lower
// one of an even count: a disturbed step is only ever slower). The
// recompute counts with the backward, so the simulation that takes these
// costs re-materializes nothing (RematMode::kNever): the times already
// hold it. Nothing when no step has both a forward and a backward.
std::optional<StageCost> MeasuredStageCost(
    const std::vector<StepTimeline>& steps, int64_t micro_batches);

// Each worker's share of a step idle (stage 0's worker first) when the
// stages cost `stages` (K x v of them, in model order, as
// MeasuredStageCost gives them or the controller's per-layer estimates
// add up to), under `kind` with M micro-batches and `v` chunks per
// worker, links free. `order_ticks`: the phase times ZB-V's order is
// built for (the runtime's: CostModelTicks), empty for the other
// schedules. Empty when the schedule does not complete.
std::vector<double> SimulatedBubbles(const std::vector<StageCost>& stages,
                                     ScheduleKind kind, int64_t m, int64_t v,
                                     std::vector<PhaseTicks> order_ticks);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_MEASURED_CUT_H_
