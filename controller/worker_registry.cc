#include "controller/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "controller/job_status.h"
#include "services/pipeline/schedule.h"

namespace gpipe::controller {

namespace v1 = gpipe::v1;

absl::StatusOr<std::shared_ptr<WorkerRecord>> WorkerRegistry::Add(
    const v1::WorkerHello& hello, absl::Time now) {
  if (hello.worker_id().empty()) {
    return absl::InvalidArgumentError("hello.worker_id: must be set");
  }
  if (hello.address().empty()) {
    return absl::InvalidArgumentError("hello.address: must be set");
  }
  if (workers_.find(hello.worker_id()) != workers_.end()) {
    return absl::AlreadyExistsError(
        absl::StrCat("worker ", hello.worker_id(), " is already attached"));
  }
  auto worker = std::make_shared<WorkerRecord>();
  worker->attach_seq = next_seq_++;
  worker->last_heartbeat = now;
  worker->session_key = hello.session_key();
  worker->runs_chunks =
      std::find(hello.capabilities().begin(), hello.capabilities().end(),
                kChunksCapability) != hello.capabilities().end();
  worker->runs_zero_bubble_v =
      worker->runs_chunks &&
      std::find(hello.capabilities().begin(), hello.capabilities().end(),
                kZeroBubbleVCapability) != hello.capabilities().end();
  v1::WorkerInfo& info = worker->info;
  info.set_worker_id(hello.worker_id());
  info.set_address(hello.address());
  info.set_state(v1::IDLE);
  *info.mutable_resources() = hello.resources();
  *info.mutable_attached() = ToTimestamp(now);
  *info.mutable_last_heartbeat() = ToTimestamp(now);
  workers_.emplace(hello.worker_id(), worker);
  return worker;
}

std::shared_ptr<WorkerRecord> WorkerRegistry::Find(std::string_view id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : it->second;
}

void WorkerRegistry::Remove(std::string_view id) {
  auto it = workers_.find(id);
  if (it != workers_.end()) workers_.erase(it);
}

std::vector<std::shared_ptr<WorkerRecord>> WorkerRegistry::All() const {
  std::vector<std::shared_ptr<WorkerRecord>> all;
  for (const auto& [id, worker] : workers_) all.push_back(worker);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a->attach_seq < b->attach_seq;
  });
  return all;
}

std::vector<std::shared_ptr<WorkerRecord>> WorkerRegistry::Free(
    absl::Time now) const {
  std::vector<std::shared_ptr<WorkerRecord>> free = All();
  std::erase_if(free, [now](const auto& w) {
    return !w->idle() || now < w->quarantined_until ||
           w->last_heartbeat <= w->suspect_since;
  });
  return free;
}

std::vector<std::shared_ptr<WorkerRecord>> WorkerRegistry::Expired(
    absl::Time now, absl::Duration timeout) const {
  std::vector<std::shared_ptr<WorkerRecord>> expired = All();
  std::erase_if(expired, [&](const auto& w) {
    return now - w->last_heartbeat <= timeout;
  });
  return expired;
}

void WorkerRegistry::Send(WorkerRecord& worker, v1::ControllerMessage message) {
  worker.outbox.push_back(std::move(message));
}

void WorkerRegistry::MarkBusy(WorkerRecord& worker, std::string_view job_id,
                              int64_t stage, int64_t replica) {
  worker.info.set_state(v1::BUSY);
  worker.info.set_job_id(std::string(job_id));
  worker.info.set_stage(stage);
  worker.info.set_replica(replica);
}

void WorkerRegistry::MarkIdle(WorkerRecord& worker) {
  worker.info.set_state(v1::IDLE);
  worker.info.clear_job_id();
  worker.info.clear_stage();
  worker.info.clear_replica();
}

}  // namespace gpipe::controller
