// One training step of a worker that holds several stages of its pipeline
// (the chunks of an interleaved schedule) and runs them on one thread: the
// in-process pipeline and a worker process drive their chunks the same way.
#ifndef GPIPE_SERVICES_PIPELINE_WORKER_STEP_H_
#define GPIPE_SERVICES_PIPELINE_WORKER_STEP_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "services/pipeline/schedule.h"
#include "services/pipeline/stage.h"

namespace gpipe {

// Runs step `step` of `chunks` (chunk c at [c], its ops naming it by
// Op::chunk) through `ops` (MakeWorkerSchedule's with its transfers,
// WithTransfers, ending with the optimizer step). The optimizer step's two
// halves go over the chunks in opposite orders: the clipping norm passes down
// the chain (chunk 0 first: its upstream is on another worker) and the total
// back up (the last chunk first), so no chunk waits for one this thread has not
// reached. Each chunk's result at its index.
absl::StatusOr<std::vector<StageStepResult>> RunWorkerStep(
    const std::vector<Stage*>& chunks, const std::vector<Op>& ops,
    int64_t step);

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_WORKER_STEP_H_
