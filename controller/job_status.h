// Job status in Kubernetes style: which states are terminal, conditions
// (type, status, reason, message, time) and timestamps. Pure functions on
// the JobStatus message; the controller's state machine calls them.
#ifndef GPIPE_CONTROLLER_JOB_STATUS_H_
#define GPIPE_CONTROLLER_JOB_STATUS_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"
#include "gpipe/v1/controller.pb.h"
#include "services/pipeline/step_plan.h"

namespace gpipe::controller {

// Condition types.
inline constexpr std::string_view kScheduled = "Scheduled";
inline constexpr std::string_view kRunning = "Running";
inline constexpr std::string_view kComplete = "Complete";
inline constexpr std::string_view kFailed = "Failed";
inline constexpr std::string_view kCancelled = "Cancelled";
// Set when a restart or resume found checkpoints unusable: True when an
// older one was restored, False when none was and training began again.
inline constexpr std::string_view kRestored = "Restored";

google::protobuf::Timestamp ToTimestamp(absl::Time t);
absl::Time FromTimestamp(const google::protobuf::Timestamp& t);

// What ListJobs shows of a job: the spec's name, steps, batch size and
// pipeline, and the status without its evaluation history, so a page of
// jobs stays small however large their specs are.
gpipe::v1::Job JobSummary(const gpipe::v1::Job& job);

// SUCCEEDED, FAILED and CANCELLED: nothing changes a job after these but
// ResumeJob (of a failed or cancelled one).
bool IsTerminal(gpipe::v1::JobState state);

// Sets the condition of `type`, adding it when absent. Like Kubernetes'
// lastTransitionTime, its time moves only when its status changes.
void SetCondition(gpipe::v1::JobStatus* status, std::string_view type,
                  bool value, std::string_view reason, std::string_view message,
                  absl::Time now);

// Removes the condition of `type` (a resumed job's Failed or Cancelled).
void RemoveCondition(gpipe::v1::JobStatus* status, std::string_view type);

// The condition of `type`, or nullptr.
const gpipe::v1::Condition* FindCondition(const gpipe::v1::JobStatus& status,
                                          std::string_view type);

// Ends a job: sets `state` (terminal), the finished time, the condition
// `type` (Complete, Failed or Cancelled) true with `reason` and `message`,
// and Running false when it was set.
void MarkTerminal(gpipe::v1::JobStatus* status, gpipe::v1::JobState state,
                  std::string_view type, std::string_view reason,
                  std::string_view message, absl::Time now);

// InvalidArgument unless `e` is an evaluation a stage could have made: a
// finite, non-negative loss, an accuracy in [0, 1], targets counted.
absl::Status CheckEvaluation(const gpipe::v1::Evaluation& e);
// CheckEvaluation, and a periodic one must be of an evaluation step of
// `plan`.
absl::Status CheckPeriodicEvaluation(const gpipe::v1::Evaluation& e,
                                     const StepPlan& plan);

// How many evaluations JobStatus.evaluations keeps (the newest).
inline constexpr int kEvaluationHistory = 64;

// Records `e` (its step set) as the latest evaluation and in the history by
// step: one of a step already there (a replay after a restart) replaces it,
// and the oldest fall off beyond kEvaluationHistory.
void RecordEvaluation(gpipe::v1::JobStatus* status,
                      const gpipe::v1::Evaluation& e);

}  // namespace gpipe::controller

#endif  // GPIPE_CONTROLLER_JOB_STATUS_H_
