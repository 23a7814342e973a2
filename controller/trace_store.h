// The stage timelines workers send (one StepTrace per stage, replica and
// step), kept for GetTrace with bounded memory: the last `keep_steps` steps
// of each stage of each replica of a job, for the `keep_jobs` jobs that
// reported most recently. A 1000-step job with M=64 and K=8 thus holds
// keep_steps x 8 records of 3 x 64 + 1 ops, about 1.5 MB at the default 16
// steps. Not thread-safe (the controller's mutex guards it).
#ifndef GPIPE_CONTROLLER_TRACE_STORE_H_
#define GPIPE_CONTROLLER_TRACE_STORE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "gpipe/v1/controller.pb.h"

namespace gpipe::controller {

class TraceStore {
 public:
  static constexpr int64_t kDefaultKeepSteps = 16;
  static constexpr int64_t kDefaultKeepJobs = 32;

  TraceStore(int64_t keep_steps = kDefaultKeepSteps,
             int64_t keep_jobs = kDefaultKeepJobs);

  // Stores `trace`. A track (stage of a replica) whose newest step is more
  // than `keep_steps` behind this one is dropped. A record of a step this
  // stage of this replica already reported (a replay after a restart)
  // replaces the older one; a step older
  // than every kept one when the stage's window is full is dropped.
  void Add(gpipe::v1::StepTrace trace);

  // The kept records of `job_id` with first <= step <= last (an end left
  // out: the oldest or newest kept), by step, replica, then stage, with the
  // kept range. FailedPrecondition when nothing is kept for the job;
  // InvalidArgument when first > last or a step is negative; OutOfRange
  // when no kept step falls in the range (the message says which are kept).
  // Only steps, first_stored_step and last_stored_step are set.
  absl::StatusOr<gpipe::v1::GetTraceResponse> Get(
      std::string_view job_id, std::optional<int64_t> first,
      std::optional<int64_t> last) const;

  void Forget(std::string_view job_id);

  size_t jobs() const { return jobs_.size(); }
  int64_t keep_steps() const { return keep_steps_; }

 private:
  struct JobTraces {
    uint64_t last_update = 0;  // for evicting the stalest job
    // (replica, stage) -> its kept steps, oldest first.
    std::map<std::pair<int64_t, int64_t>, std::deque<gpipe::v1::StepTrace>>
        tracks;
  };

  const int64_t keep_steps_;
  const int64_t keep_jobs_;
  uint64_t clock_ = 0;
  std::map<std::string, JobTraces, std::less<>> jobs_;
};

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_TRACE_STORE_H_
