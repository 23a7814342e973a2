#include "controller/store_writer.h"

#include <utility>

#include "services/core/log.h"

namespace gpipe::controller {

StoreWriter::StoreWriter(JobStore* store) : store_(store) {
  thread_ = std::thread([this] { Loop(); });
}

StoreWriter::~StoreWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

uint64_t StoreWriter::Put(int64_t seq, const gpipe::v1::Job& job) {
  absl::MutexLock lock(&mu_);
  Queued& q = queued_[job.id()];
  q.seq = seq;
  q.job = job;
  q.deleted = false;
  q.ticket = ++next_ticket_;
  return q.ticket;
}

uint64_t StoreWriter::Delete(const std::string& id) {
  absl::MutexLock lock(&mu_);
  Queued& q = queued_[id];
  q.deleted = true;
  q.ticket = ++next_ticket_;
  return q.ticket;
}

void StoreWriter::WaitWritten(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  const auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return written_ >= ticket;
  };
  mu_.Await(absl::Condition(&done));
}

void StoreWriter::Loop() {
  for (;;) {
    std::map<std::string, Queued> batch;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queued_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queued_.empty()) return;  // stopping, and everything is written
      batch.swap(queued_);
    }
    uint64_t newest = 0;
    for (auto& [id, q] : batch) {
      // The job goes on in memory: a store that fails now only loses what
      // a restart would replay (logged for the operator).
      if (q.deleted) {
        if (absl::Status s = store_->Delete(id); !s.ok()) {
          LogError("cannot delete job %s from the store: %s", id, s.ToString());
        }
      } else if (absl::Status s = store_->Put(q.seq, q.job); !s.ok()) {
        LogError("cannot store job %s: %s", id, s.ToString());
      }
      newest = std::max(newest, q.ticket);
    }
    absl::MutexLock lock(&mu_);
    // Every ticket up to `newest` was queued before this batch was taken:
    // it is in the batch, replaced by a newer one in it, or written before.
    written_ = std::max(written_, newest);
  }
}

}  // namespace gpipe::controller
