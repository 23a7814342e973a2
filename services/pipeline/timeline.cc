#include "services/pipeline/timeline.h"

#include <algorithm>

namespace gpipe {

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kBackwardInput:
      return "backward_input";
    case Phase::kBackwardWeight:
      return "backward_weight";
  }
  return "?";
}

double StepTimeline::busy_seconds() const {
  int64_t ns = 0;
  for (const OpRecord& op : ops) ns += op.end_ns - op.start_ns;
  return ns * 1e-9;
}

double StepTimeline::busy_seconds(Phase phase) const {
  int64_t ns = 0;
  for (const OpRecord& op : ops)
    if (op.phase == phase) ns += op.end_ns - op.start_ns;
  return ns * 1e-9;
}

Timeline::Timeline(Clock::time_point origin, size_t keep_steps)
    : origin_(origin), keep_(keep_steps == 0 ? 1 : keep_steps) {}

int64_t Timeline::Now() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() -
                                                              origin_)
      .count();
}

void Timeline::BeginStep(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  current_ = StepTimeline();
  current_.step = step;
  current_.start_ns = Now();
}

void Timeline::Record(const OpRecord& op) {
  std::lock_guard<std::mutex> lock(mu_);
  current_.ops.push_back(op);
}

void Timeline::RecordSend(Phase made_by, int64_t micro_batch, int64_t start_ns,
                          int64_t end_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!current_.ops.empty()) {
    OpRecord& last = current_.ops.back();
    if (last.phase == made_by && last.micro_batch == micro_batch) {
      last.end_ns = std::max(last.end_ns, end_ns);
      return;
    }
  }
  current_.ops.push_back({made_by, micro_batch, start_ns, end_ns});
}

void Timeline::EndStep() {
  std::lock_guard<std::mutex> lock(mu_);
  current_.end_ns = Now();
  done_.push_back(std::move(current_));
  current_ = StepTimeline();
  while (done_.size() > keep_) done_.pop_front();
}

std::vector<StepTimeline> Timeline::Steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<StepTimeline>(done_.begin(), done_.end());
}

StepTimeline Timeline::LastStep() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_.empty() ? StepTimeline() : done_.back();
}

}  // namespace gpipe
