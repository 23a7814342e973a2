#include "controller/job_status.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "services/core/status.h"

namespace gpipe::controller {

namespace v1 = gpipe::v1;

absl::Time FromTimestamp(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

gpipe::v1::Job JobSummary(const gpipe::v1::Job& job) {
  gpipe::v1::Job summary;
  summary.set_id(job.id());
  gpipe::v1::JobSpec& spec = *summary.mutable_spec();
  spec.set_name(job.spec().name());
  spec.set_steps(job.spec().steps());
  spec.set_batch_size(job.spec().batch_size());
  *spec.mutable_pipeline() = job.spec().pipeline();
  *summary.mutable_status() = job.status();
  summary.mutable_status()->clear_evaluations();
  return summary;
}

google::protobuf::Timestamp ToTimestamp(absl::Time t) {
  const int64_t nanos = absl::ToUnixNanos(t);
  google::protobuf::Timestamp ts;
  int64_t seconds = nanos / 1000000000;
  int64_t rest = nanos % 1000000000;
  if (rest < 0) {
    rest += 1000000000;
    --seconds;
  }
  ts.set_seconds(seconds);
  ts.set_nanos(static_cast<int32_t>(rest));
  return ts;
}

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED ||
         state == v1::CANCELLED;
}

void SetCondition(v1::JobStatus* status, std::string_view type, bool value,
                  std::string_view reason, std::string_view message,
                  absl::Time now) {
  v1::Condition* condition = nullptr;
  for (v1::Condition& c : *status->mutable_conditions()) {
    if (c.type() == type) condition = &c;
  }
  if (condition == nullptr) {
    condition = status->add_conditions();
    condition->set_type(std::string(type));
    condition->set_status(!value);  // so that the time is set below
  }
  if (condition->status() != value) {
    condition->set_status(value);
    *condition->mutable_time() = ToTimestamp(now);
  }
  condition->set_reason(std::string(reason));
  condition->set_message(std::string(message));
}

void RemoveCondition(v1::JobStatus* status, std::string_view type) {
  auto* conditions = status->mutable_conditions();
  for (int i = 0; i < conditions->size(); ++i) {
    if (conditions->Get(i).type() == type) {
      conditions->DeleteSubrange(i, 1);
      return;
    }
  }
}

const v1::Condition* FindCondition(const v1::JobStatus& status,
                                   std::string_view type) {
  for (const v1::Condition& c : status.conditions()) {
    if (c.type() == type) return &c;
  }
  return nullptr;
}

void MarkTerminal(v1::JobStatus* status, v1::JobState state,
                  std::string_view type, std::string_view reason,
                  std::string_view message, absl::Time now) {
  status->set_state(state);
  *status->mutable_finished() = ToTimestamp(now);
  if (FindCondition(*status, kRunning) != nullptr) {
    SetCondition(status, kRunning, false, reason, message, now);
  }
  // A job that ends while it waits (its data checked, workers awaited)
  // says so there too: a FAILED job still read "CheckingData".
  if (const v1::Condition* scheduled = FindCondition(*status, kScheduled);
      scheduled != nullptr && !scheduled->status()) {
    SetCondition(status, kScheduled, false, reason, message, now);
  }
  SetCondition(status, type, true, reason, message, now);
}

absl::Status CheckEvaluation(const v1::Evaluation& e) {
  if (!std::isfinite(e.loss()) || e.loss() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss ", e.loss(),
                     " is not a finite, non-negative "
                     "number"));
  }
  if (!(e.accuracy() >= 0 && e.accuracy() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("accuracy ", e.accuracy(), " is not in [0, 1]"));
  }
  if (e.counted() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("counted ", e.counted(), " is not positive"));
  }
  return absl::OkStatus();
}

absl::Status CheckPeriodicEvaluation(const v1::Evaluation& e,
                                     const StepPlan& plan) {
  RETURN_IF_ERROR(CheckEvaluation(e));
  if (!plan.EvaluatesAfter(e.step())) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", e.step(), " is not an evaluation step (every ",
                     plan.eval_every(), ", ", plan.steps(), " steps)"));
  }
  return absl::OkStatus();
}

void RecordEvaluation(v1::JobStatus* status, const v1::Evaluation& e) {
  *status->mutable_latest_evaluation() = e;
  auto* list = status->mutable_evaluations();
  auto at = std::find_if(
      list->begin(), list->end(),
      [&](const v1::Evaluation& kept) { return kept.step() >= e.step(); });
  if (at != list->end() && at->step() == e.step()) {
    *at = e;
    return;
  }
  const int index = static_cast<int>(at - list->begin());
  *list->Add() = e;
  for (int i = list->size() - 1; i > index; --i) list->SwapElements(i, i - 1);
  if (list->size() > kEvaluationHistory) {
    list->DeleteSubrange(0, list->size() - kEvaluationHistory);
  }
}

}  // namespace gpipe::controller
