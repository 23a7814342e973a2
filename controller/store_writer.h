// Writes jobs to the JobStore on a thread of its own, so the controller's
// lock is never held across SQLite. Put queues a job's newest state (a
// later Put of the same job replaces one still queued) and returns a
// ticket; WaitWritten returns once that state, or a newer one, is on disk.
// The API waits for it outside the lock, so an acknowledged submit or
// cancel survives a crash; progress is written as fast as the disk allows.
#ifndef GPIPE_CONTROLLER_STORE_WRITER_H_
#define GPIPE_CONTROLLER_STORE_WRITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "controller/job_store.h"
#include "gpipe/v1/controller.pb.h"

namespace gpipe::controller {

class StoreWriter {
 public:
  // A write that fails (a full disk) is tried again every `retry_every`
  // with the job's newest state, until it succeeds or a newer one is
  // queued: a job's last change (SUCCEEDED) written while the disk was full
  // was lost for good, and a restarted controller ran the job again.
  // `on_failure` is called for each failed write (the metric).
  explicit StoreWriter(JobStore* store,  // not owned; outlives this
                       std::function<void()> on_failure = nullptr,
                       absl::Duration retry_every = absl::Seconds(2));
  ~StoreWriter();  // writes what is queued, then stops

  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  uint64_t Put(int64_t seq, const gpipe::v1::Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues the removal of job `id` (replacing a Put still queued).
  uint64_t Delete(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  void WaitWritten(uint64_t ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // The same, and whether job `id`'s state as of `ticket` (or a newer one)
  // reached the store: the store's error where its last write of `id`
  // failed (a full disk), so a caller need not acknowledge what a restart
  // would lose.
  absl::Status WaitStored(uint64_t ticket, const std::string& id)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queued {
    int64_t seq = 0;
    gpipe::v1::Job job;
    uint64_t ticket = 0;
    bool deleted = false;
  };
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  JobStore* const store_;
  absl::Mutex mu_;
  // Jobs whose last write failed: the ticket written and the store's error.
  std::map<std::string, std::pair<uint64_t, absl::Status>> failed_
      ABSL_GUARDED_BY(mu_);
  // Their writes, to try again.
  std::map<std::string, Queued> retry_ ABSL_GUARDED_BY(mu_);
  const std::function<void()> on_failure_;
  const absl::Duration retry_every_;
  std::map<std::string, Queued> queued_ ABSL_GUARDED_BY(mu_);  // by job id
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  // Every ticket up to this one is on disk (or failed, logged).
  uint64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_STORE_WRITER_H_
