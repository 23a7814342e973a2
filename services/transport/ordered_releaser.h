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
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace gpipe {

class OrderedReleaser {
 public:
  // `await(sequence)` blocks until that chunk's copy out is done; `release
  // (sequence)` tells the sender (false: the link broke). A failure of
  // either ends the releases with that status. Both run on its thread.
  OrderedReleaser(std::function<absl::Status(int64_t)> await,
                  std::function<bool(int64_t)> release);
  // Stop(), if it was not called.
  ~OrderedReleaser();
  OrderedReleaser(const OrderedReleaser&) = delete;
  OrderedReleaser& operator=(const OrderedReleaser&) = delete;

  // Queues chunk `sequence`, read after every chunk queued before it: true.
  // False once Stop was called, after every chunk queued before has been
  // released: the caller then releases it itself, still in order. The
  // failure of an earlier release or copy, once there was one.
  absl::StatusOr<bool> Add(int64_t sequence) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases what is queued (each after its copy), then ends the thread and
  // returns: nothing of the releaser runs any more (the stream it writes to
  // may go). Not from the releasing thread.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Seconds the thread spent in `await` so far (copies out not yet done
  // when their chunk was next): a figure for the link's log.
  double await_seconds() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();

  const std::function<absl::Status(int64_t)> await_;
  const std::function<bool(int64_t)> release_;
  mutable absl::Mutex mu_;
  std::deque<int64_t> pending_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool exited_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  double await_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_TRANSPORT_ORDERED_RELEASER_H_
