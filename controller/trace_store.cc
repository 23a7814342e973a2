#include "controller/trace_store.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/core/strings.h"

namespace gpipe::controller {

namespace v1 = gpipe::v1;

TraceStore::TraceStore(int64_t keep_steps, int64_t keep_jobs)
    : keep_steps_(std::max<int64_t>(1, keep_steps)),
      keep_jobs_(std::max<int64_t>(1, keep_jobs)) {}

void TraceStore::Add(v1::StepTrace trace) {
  auto it = jobs_.find(trace.job_id());
  if (it == jobs_.end()) {
    if (static_cast<int64_t>(jobs_.size()) >= keep_jobs_) {
      auto stalest = std::min_element(
          jobs_.begin(), jobs_.end(), [](const auto& a, const auto& b) {
            return a.second.last_update < b.second.last_update;
          });
      jobs_.erase(stalest);
    }
    it = jobs_.emplace(trace.job_id(), JobTraces()).first;
  }
  JobTraces& job = it->second;
  job.last_update = ++clock_;
  std::deque<v1::StepTrace>& steps =
      job.tracks[{trace.replica(), trace.stage()}];
  // Steps arrive in order; a replay sends an old step again.
  auto at = std::lower_bound(
      steps.begin(), steps.end(), trace.step(),
      [](const v1::StepTrace& t, int64_t step) { return t.step() < step; });
  if (at != steps.end() && at->step() == trace.step()) {
    *at = std::move(trace);
    return;
  }
  if (at == steps.begin() && static_cast<int64_t>(steps.size()) >= keep_steps_)
    return;
  const int64_t step = trace.step();
  steps.insert(at, std::move(trace));
  while (static_cast<int64_t>(steps.size()) > keep_steps_) steps.pop_front();
  // A track that stopped (a replica the job shrank away, stages of a cut it
  // re-partitioned from) goes once the others are a window past it: its
  // old steps would stretch every picture of the newest ones.
  for (auto t = job.tracks.begin(); t != job.tracks.end();) {
    if (!t->second.empty() && t->second.back().step() < step - keep_steps_) {
      t = job.tracks.erase(t);
    } else {
      ++t;
    }
  }
}

void TraceStore::Forget(std::string_view job_id) {
  auto it = jobs_.find(job_id);
  if (it != jobs_.end()) jobs_.erase(it);
}

absl::StatusOr<v1::GetTraceResponse> TraceStore::Get(
    std::string_view job_id, std::optional<int64_t> first,
    std::optional<int64_t> last) const {
  if ((first && *first < 0) || (last && *last < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("steps are 0-based and cannot be negative (first_step ",
                     first.value_or(0), ", last_step ", last.value_or(0), ")"));
  }
  if (first && last && *first > *last) {
    return absl::InvalidArgumentError(
        absl::StrCat("first_step ", *first, " is after last_step ", *last));
  }
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.tracks.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no step timelines are stored for job ", AsAbsl(job_id),
                     " (it has not run a step yet, or its timelines were "
                     "dropped for newer jobs)"));
  }
  int64_t oldest = std::numeric_limits<int64_t>::max();
  int64_t newest = std::numeric_limits<int64_t>::min();
  for (const auto& [track, steps] : it->second.tracks) {
    if (steps.empty()) continue;
    oldest = std::min(oldest, steps.front().step());
    newest = std::max(newest, steps.back().step());
  }
  const int64_t from = first.value_or(oldest);
  const int64_t to = last.value_or(newest);
  std::vector<const v1::StepTrace*> picked;
  for (const auto& [track, steps] : it->second.tracks) {
    for (const v1::StepTrace& t : steps) {
      if (t.step() >= from && t.step() <= to) picked.push_back(&t);
    }
  }
  if (picked.empty()) {
    return absl::OutOfRangeError(absl::StrCat(
        "steps ", from, "..", to, " of job ", AsAbsl(job_id),
        " are not stored; the controller keeps steps ", oldest, "..", newest,
        " (the last ", keep_steps_, " of each stage)"));
  }
  std::stable_sort(picked.begin(), picked.end(),
                   [](const v1::StepTrace* a, const v1::StepTrace* b) {
                     return a->step() < b->step();
                   });
  v1::GetTraceResponse response;
  response.set_job_id(std::string(job_id));
  response.set_first_stored_step(oldest);
  response.set_last_stored_step(newest);
  for (const v1::StepTrace* t : picked) *response.add_steps() = *t;
  return response;
}

}  // namespace gpipe::controller
