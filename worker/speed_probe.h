// How fast this worker computes, measured once at start-up, before it
// attaches: a fixed workload of Linear layers, forward and backward, on the
// stages' compute threads, run for a fraction of a second so that a CPU
// quota's throttling shows in it, and slowed by --compute_slowdown like
// the stages' layers. The controller's balancer takes it as its first
// guess of the worker's speed (controller/balancer.h) until a job's own
// layers, run on several workers, say better. CPU only: a GPU worker
// reports none (its stages' layers are timed through their busy time).
#ifndef GPIPE_WORKER_SPEED_PROBE_H_
#define GPIPE_WORKER_SPEED_PROBE_H_

#include "absl/status/statusor.h"

namespace gpipe {

// GFLOP/s of the probe workload on the calling thread's compute-thread
// setting: the best of three windows of min_seconds / 3 each. Errors: the
// workload's model could not be built (a bug).
absl::StatusOr<double> ProbeComputeSpeed(double slowdown = 1.0,
                                         double min_seconds = 0.3);

}  // namespace gpipe

#endif  // GPIPE_WORKER_SPEED_PROBE_H_
