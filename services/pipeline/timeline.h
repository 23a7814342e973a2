// What each stage did and when: one record per op (forward, backward, the
// recompute inside a backward, optimizer step) and one per step. Bubble time
// of a stage in a step is the step's wall time on that stage minus its busy
// time. Keeps the last few steps only, so memory stays bounded.
#ifndef GPIPE_SERVICES_PIPELINE_TIMELINE_H_
#define GPIPE_SERVICES_PIPELINE_TIMELINE_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string_view>
#include <vector>

namespace gpipe {

// kBackward is a whole backward; a split backward (zero-bubble schedules)
// records its two halves as kBackwardInput and kBackwardWeight.
enum class Phase {
  kForward,
  kBackward,
  kRecompute,
  kOptimizer,
  kBackwardInput,
  kBackwardWeight,
};
// forward, backward, recompute, optimizer, backward_input, backward_weight
std::string_view PhaseName(Phase phase);

struct OpRecord {
  Phase phase;
  int64_t micro_batch;  // -1 for the optimizer
  int64_t start_ns;     // since the timeline's origin
  int64_t end_ns;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

struct StepTimeline {
  int64_t step = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  std::vector<OpRecord> ops;

  double wall_seconds() const { return (end_ns - start_ns) * 1e-9; }
  double busy_seconds() const;
  double busy_seconds(Phase phase) const;
  double bubble_seconds() const { return wall_seconds() - busy_seconds(); }
};

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;
  // `origin` is shared by the stages of one process so their records line
  // up; `keep_steps` bounds memory.
  explicit Timeline(Clock::time_point origin = Clock::now(),
                    size_t keep_steps = 8);

  int64_t Now() const;  // ns since the origin
  void BeginStep(int64_t step);
  void Record(const OpRecord& op);
  // A send action's [start_ns, end_ns): the end of the op that made what
  // it sends (`made_by`, of `micro_batch`) when that op is the step's last
  // record, as the schedules place sends; an op of its own, of the same
  // phase, otherwise.
  void RecordSend(Phase made_by, int64_t micro_batch, int64_t start_ns,
                  int64_t end_ns);
  void EndStep();

  // The most recent complete steps, oldest first (thread-safe copy).
  std::vector<StepTimeline> Steps() const;
  // The last complete step; an empty record before the first.
  StepTimeline LastStep() const;

 private:
  Clock::time_point origin_;
  size_t keep_;
  mutable std::mutex mu_;
  StepTimeline current_;
  std::deque<StepTimeline> done_;
};

// Records one op from construction to destruction.
class OpTimer {
 public:
  OpTimer(Timeline& timeline, Phase phase, int64_t micro_batch)
      : timeline_(timeline), record_{phase, micro_batch, timeline.Now(), 0} {}
  ~OpTimer() {
    record_.end_ns = timeline_.Now();
    timeline_.Record(record_);
  }
  OpRecord& record() { return record_; }

 private:
  Timeline& timeline_;
  OpRecord record_;
};

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_TIMELINE_H_
