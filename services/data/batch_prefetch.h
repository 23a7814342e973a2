// The next training step's batch, gathered on a thread of its own while the
// caller runs the current step. On a pipeline's first stage the gather (a
// pass over the batch, and a shuffle at each epoch's start) otherwise runs
// before the step's first forward, with every stage downstream waiting for
// it: on a small model a few percent of the step, all of it bubble.
#ifndef GPIPE_SERVICES_DATA_BATCH_PREFETCH_H_
#define GPIPE_SERVICES_DATA_BATCH_PREFETCH_H_

#include <cstdint>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/data/dataset.h"
#include "services/data/sampler.h"

namespace gpipe {

class BatchPrefetch {
 public:
  // What the caller gathers: the whole batch (a first stage), or only the
  // targets (a last stage, whose inputs come down the pipe).
  enum class Part { kWhole, kTargets };

  // `dataset` and `sampler` must outlive this object (both are read from
  // its thread; Dataset::Gather and Sampler::Indices are const and
  // thread-safe). One caller at a time. The batches gathered ahead are
  // host tensors of the process's allocator: they count towards a
  // TensorMemoryLimit, which the caller's thread meets at its next
  // allocation, as it meets a link reader's.
  BatchPrefetch(const Dataset* dataset, const Sampler* sampler, Part part);
  // Waits for a gather in progress.
  ~BatchPrefetch();
  BatchPrefetch(const BatchPrefetch&) = delete;
  BatchPrefetch& operator=(const BatchPrefetch&) = delete;

  // The train split's batch of `step`: the one gathered ahead when it is
  // that step's, else gathered now. Then starts on step + 1's, the step a
  // training loop asks for next (a step that asks for another, as after a
  // restore, gets its own batch and drops the one gathered ahead). The
  // same tensors as Dataset::Gather's, with `targets` only for kTargets.
  Batch Take(int64_t step);

  // How many of the batches Take returned were gathered ahead (for tests).
  int64_t taken_ahead() const;

 private:
  Batch GatherNow(int64_t step) const;
  void Run();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || next_ >= 0;
  }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; }

  const Dataset* dataset_;
  const Sampler* sampler_;
  Part part_;
  mutable absl::Mutex mu_;
  int64_t next_ ABSL_GUARDED_BY(mu_) = -1;  // the step to gather, or -1
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // gathering `next_`'s
  int64_t ahead_step_ ABSL_GUARDED_BY(mu_) = -1;
  Batch ahead_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool no_thread_ ABSL_GUARDED_BY(mu_) = false;  // none could be started
  int64_t taken_ahead_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // started by the first Take
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_DATA_BATCH_PREFETCH_H_
