#include "controller/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/job_status.h"
#include "services/core/log.h"

namespace gpipe::controller {

namespace v1 = gpipe::v1;

JobTable::JobTable() : rng_(std::random_device{}()) {}

std::string JobTable::NewId() {
  while (true) {
    std::string id =
        absl::StrFormat("job-%08x", static_cast<uint32_t>(rng_() >> 32));
    if (jobs_.find(id) == jobs_.end()) return id;
  }
}

JobRecord& JobTable::Add(v1::JobSpec spec, int64_t stages, absl::Time now) {
  auto record = std::make_unique<JobRecord>();
  record->seq = next_seq_++;
  record->stages = stages;
  record->job.set_id(NewId());
  *record->job.mutable_spec() = std::move(spec);
  v1::JobStatus& status = record->status();
  status.set_state(v1::PENDING);
  status.set_total_steps(record->job.spec().steps());
  *status.mutable_created() = ToTimestamp(now);
  // The elastic grace period of a new job counts from its submission too.
  record->waiting_since = now;
  JobRecord& added = *record;
  jobs_.emplace(added.id(), std::move(record));
  return added;
}

absl::StatusOr<JobRecord*> JobTable::Restore(StoredJob stored, int64_t stages) {
  if (jobs_.find(stored.job.id()) != jobs_.end()) {
    return absl::AlreadyExistsError(
        absl::StrCat("job ", stored.job.id(), " is stored twice"));
  }
  auto record = std::make_unique<JobRecord>();
  record->seq = stored.seq;
  record->stages = stages;
  record->job = std::move(stored.job);
  record->logged_state = record->status().state();
  next_seq_ = std::max<uint64_t>(next_seq_, stored.seq + 1);
  JobRecord* restored = record.get();
  jobs_.emplace(restored->id(), std::move(record));
  return restored;
}

JobRecord* JobTable::Find(std::string_view id) {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

uint64_t JobTable::Remove(std::string_view id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return 0;
  const std::string key = it->first;
  jobs_.erase(it);
  return store_ != nullptr ? store_->Delete(key) : 0;
}

std::vector<JobRecord*> JobTable::Running() {
  std::vector<JobRecord*> running;
  for (auto& [id, job] : jobs_) {
    if (job->status().state() == v1::RUNNING && !job->merging) {
      running.push_back(job.get());
    }
  }
  std::sort(
      running.begin(), running.end(),
      [](const JobRecord* a, const JobRecord* b) { return a->seq < b->seq; });
  return running;
}

std::vector<JobRecord*> JobTable::Waiting() {
  std::vector<JobRecord*> pending;
  for (auto& [id, job] : jobs_) {
    const v1::JobState state = job->status().state();
    if (state == v1::PENDING || state == v1::RESTARTING) {
      pending.push_back(job.get());
    }
  }
  // A job that was running goes back onto workers before the queue: a
  // queued job took a restarting job's workers after a controller restart,
  // and the job that had been running waited for it to end.
  std::sort(pending.begin(), pending.end(),
            [](const JobRecord* a, const JobRecord* b) {
              const bool a_ran = a->status().state() == v1::RESTARTING;
              const bool b_ran = b->status().state() == v1::RESTARTING;
              return a_ran != b_ran ? a_ran : a->seq < b->seq;
            });
  return pending;
}

std::vector<const JobRecord*> JobTable::NewestFirst() const {
  std::vector<const JobRecord*> all;
  for (const auto& [id, job] : jobs_) all.push_back(job.get());
  std::sort(all.begin(), all.end(), [](const JobRecord* a, const JobRecord* b) {
    return a->seq > b->seq;
  });
  return all;
}

uint64_t JobTable::Publish(JobRecord& job, std::string message,
                           absl::Time now) {
  const v1::JobState state = job.status().state();
  if (state != job.logged_state) {
    LogInfo("job %s %s: %s", job.id(), v1::JobState_Name(state), message);
    job.logged_state = state;
  }
  v1::JobEvent& event = job.events.emplace_back();
  *event.mutable_time() = ToTimestamp(now);
  *event.mutable_job() = job.job;
  event.set_message(std::move(message));
  ++job.version;
  const size_t keep = IsTerminal(state) ? kEndedEventHistory : kEventHistory;
  while (job.events.size() > keep) job.events.pop_front();
  if (store_ != nullptr) job.store_ticket = store_->Put(job.seq, job.job);
  return job.store_ticket;
}

}  // namespace gpipe::controller
