#include "services/pipeline/schedule.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace gpipe {

std::vector<Op> MakeSchedule(ScheduleKind kind, int64_t k, int64_t m,
                             int64_t stage) {
  std::vector<Op> ops;
  ops.reserve(2 * m + 1);
  if (kind == ScheduleKind::kGPipe) {
    for (int64_t i = 0; i < m; ++i) ops.push_back({OpKind::kForward, i});
    for (int64_t i = 0; i < m; ++i) ops.push_back({OpKind::kBackward, i});
  } else {
    // Stage s runs K-1-s forwards ahead, then one forward and one backward
    // in turn, then drains; stage 0 thus never holds more than K.
    const int64_t warmup = std::min(k - 1 - stage, m);
    int64_t next_forward = 0, next_backward = 0;
    for (; next_forward < warmup; ++next_forward)
      ops.push_back({OpKind::kForward, next_forward});
    while (next_forward < m) {
      ops.push_back({OpKind::kForward, next_forward++});
      ops.push_back({OpKind::kBackward, next_backward++});
    }
    while (next_backward < m)
      ops.push_back({OpKind::kBackward, next_backward++});
  }
  ops.push_back({OpKind::kOptimizerStep, -1});
  return ops;
}

std::string_view ScheduleName(ScheduleKind kind) {
  return kind == ScheduleKind::kGPipe ? "gpipe" : "1f1b";
}

absl::StatusOr<ScheduleKind> ParseScheduleName(std::string_view name) {
  if (name == "gpipe" || name == "GPIPE") return ScheduleKind::kGPipe;
  if (name == "1f1b" || name == "ONE_F_ONE_B") return ScheduleKind::kOneFOneB;
  return absl::InvalidArgumentError(absl::StrCat(
      "schedule: '", std::string(name), "' is not one of gpipe, 1f1b"));
}

ScheduleKind ScheduleFromSpec(gpipe::v1::Schedule schedule) {
  return schedule == gpipe::v1::ONE_F_ONE_B ? ScheduleKind::kOneFOneB
                                            : ScheduleKind::kGPipe;
}

gpipe::v1::Schedule ScheduleToSpec(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return gpipe::v1::GPIPE;
    case ScheduleKind::kOneFOneB:
      return gpipe::v1::ONE_F_ONE_B;
  }
  return gpipe::v1::GPIPE;
}

int64_t MaxLiveMicroBatches(const std::vector<Op>& ops) {
  int64_t live = 0, peak = 0;
  for (const Op& op : ops) {
    if (op.kind == OpKind::kForward) peak = std::max(peak, ++live);
    if (op.kind == OpKind::kBackward) --live;
  }
  return peak;
}

std::string ToString(const Op& op) {
  switch (op.kind) {
    case OpKind::kForward:
      return absl::StrCat("F", op.micro_batch);
    case OpKind::kBackward:
      return absl::StrCat("B", op.micro_batch);
    case OpKind::kOptimizerStep:
      return "step";
  }
  return "?";
}

}  // namespace gpipe
