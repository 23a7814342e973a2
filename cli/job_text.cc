#include "cli/job_text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gpipe::cli {

std::string StateName(gpipe::v1::JobState state) {
  if (state == gpipe::v1::JOB_STATE_UNSPECIFIED) return "UNKNOWN";
  return gpipe::v1::JobState_Name(state);
}

std::string StepText(const gpipe::v1::JobStatus& s) {
  return absl::StrCat(s.step(), "/", s.total_steps());
}

std::string LossText(const gpipe::v1::JobStatus& s) {
  // A job failed for a loss that was not finite keeps its last finite one
  // in its status (2.2e33 read as training still going); it is NaN on
  // /metrics, and not finite here.
  for (const gpipe::v1::Condition& c : s.conditions()) {
    if (c.type() == "Failed" && c.status() && c.reason() == "LossNotFinite")
      return "not finite";
  }
  return s.step() > 0 ? absl::StrFormat("%.4f", s.loss()) : "-";
}

}  // namespace gpipe::cli
