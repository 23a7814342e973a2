#include "controller/store_writer.h"

#include <utility>

#include "services/core/log.h"

namespace gpipe::controller {

StoreWriter::StoreWriter(JobStore* store, std::function<void()> on_failure,
                         absl::Duration retry_every)
    : store_(store),
      on_failure_(std::move(on_failure)),
      retry_every_(retry_every) {
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

absl::Status StoreWriter::WaitStored(uint64_t ticket, const std::string& id) {
  WaitWritten(ticket);
  absl::MutexLock lock(&mu_);
  auto it = failed_.find(id);
  if (it == failed_.end() || it->second.first < ticket) return absl::OkStatus();
  return it->second.second;
}

void StoreWriter::Loop() {
  bool last_try = false;  // stopping: failed writes get one more
  for (;;) {
    std::map<std::string, Queued> batch;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queued_.empty() || stopping_;
      };
      const bool woken =
          retry_.empty()
              ? (mu_.Await(absl::Condition(&ready)), true)
              : mu_.AwaitWithTimeout(absl::Condition(&ready), retry_every_);
      // Failed writes go again, unless a newer state of the job is queued.
      if (!woken || (stopping_ && !last_try)) {
        for (auto& [id, q] : retry_) queued_.emplace(id, std::move(q));
        retry_.clear();
        last_try = stopping_;
      }
      if (queued_.empty()) {
        if (stopping_) return;  // everything is written, or was tried
        continue;
      }
      batch.swap(queued_);
    }
    uint64_t newest = 0;
    std::map<std::string, std::pair<uint64_t, absl::Status>> outcomes;
    for (auto& [id, q] : batch) {
      // The job goes on in memory: a store that fails now only loses what
      // a restart would replay (logged for the operator; WaitStored tells
      // a caller waiting on it).
      absl::Status s;
      if (q.deleted) {
        s = store_->Delete(id);
        if (!s.ok())
          LogError("cannot delete job %s from the store: %s", id, s.ToString());
      } else {
        s = store_->Put(q.seq, q.job);
        if (!s.ok()) LogError("cannot store job %s: %s", id, s.ToString());
      }
      outcomes[id] = {q.ticket, s};
      newest = std::max(newest, q.ticket);
    }
    absl::MutexLock lock(&mu_);
    for (auto& [id, outcome] : outcomes) {
      if (outcome.second.ok()) {
        failed_.erase(id);
        retry_.erase(id);
      } else {
        failed_[id] = std::move(outcome);
        retry_[id] = std::move(batch[id]);
        if (on_failure_) on_failure_();
      }
    }
    // Every ticket up to `newest` was queued before this batch was taken:
    // it is in the batch, replaced by a newer one in it, or written before.
    written_ = std::max(written_, newest);
  }
}

}  // namespace gpipe::controller
