// Gives received chunks back to their sender in the order they were read,
// each once its copy out of the ring has finished, on a thread of its own.
// The CUDA IPC plane's receiving stage queues its copies out on its stream
// and goes on; waiting for that stream at every chunk would cost it its
// run-ahead (the host cannot queue the next kernels while it waits for the
// ones before).
#ifndef GPIPE_SERVICES_TRANSPORT_ORDERED_RELEASER_H_
#define GPIPE_SERVICES_TRANSPORT_ORDERED_RELEASER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace gpipe {

class OrderedReleaser {
 public:
  // `await(sequence)` blocks until that chunk's copy out is done; `release
  // (sequence)` tells the sender (false: the link broke). A failure of
  // either stops the releaser with that status. Both run on its thread.
  OrderedReleaser(std::function<absl::Status(int64_t)> await,
                  std::function<bool(int64_t)> release);
  // Stops and joins: chunks not yet released stay so (the link is closing).
  ~OrderedReleaser();
  OrderedReleaser(const OrderedReleaser&) = delete;
  OrderedReleaser& operator=(const OrderedReleaser&) = delete;

  // Queues chunk `sequence`, read after every chunk queued before it. After
  // a failure it returns that failure and queues nothing.
  absl::Status Add(int64_t sequence) ABSL_LOCKS_EXCLUDED(mu_);
  // No release after the one in progress; Add fails from now on.
  void Stop(absl::Status why) ABSL_LOCKS_EXCLUDED(mu_);

  // Seconds the thread spent in `await` so far (copies out not yet done
  // when their chunk was next): a figure for the link's log.
  double await_seconds() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();

  const std::function<absl::Status(int64_t)> await_;
  const std::function<bool(int64_t)> release_;
  mutable absl::Mutex mu_;
  std::deque<int64_t> pending_ ABSL_GUARDED_BY(mu_);
  absl::Status stopped_ ABSL_GUARDED_BY(mu_);
  double await_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_ORDERED_RELEASER_H_
