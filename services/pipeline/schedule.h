// Pipeline schedules as pure data: for (K stages, M micro-batches, stage) the
// ordered list of ops the stage executes in one step. Every schedule runs the
// backward ops of a stage in micro-batch order 0..M-1, so gradients
// accumulate in the same order as in the reference trainer.
#ifndef GPIPE_SERVICES_PIPELINE_SCHEDULE_H_
#define GPIPE_SERVICES_PIPELINE_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "gpipe/v1/job.pb.h"

namespace gpipe {

enum class ScheduleKind {
  kGPipe,     // fill-drain: all forwards, then all backwards
  kOneFOneB,  // PipeDream-Flush: after K-1-stage warm-up forwards, alternate
};

enum class OpKind { kForward, kBackward, kOptimizerStep };

struct Op {
  OpKind kind;
  int64_t micro_batch;  // -1 for the optimizer step

  bool operator==(const Op& o) const {
    return kind == o.kind && micro_batch == o.micro_batch;
  }
};

// The ops of `stage` (0-based, < k) for one step with `m` micro-batches,
// ending with the optimizer step. Requires k >= 1, m >= 1.
std::vector<Op> MakeSchedule(ScheduleKind kind, int64_t k, int64_t m,
                             int64_t stage);

// "gpipe" / "1f1b".
std::string_view ScheduleName(ScheduleKind kind);
absl::StatusOr<ScheduleKind> ParseScheduleName(std::string_view name);
// The job spec's enum and ours, the only place they are converted
// (unspecified: GPipe).
ScheduleKind ScheduleFromSpec(gpipe::v1::Schedule schedule);
gpipe::v1::Schedule ScheduleToSpec(ScheduleKind kind);

// Most micro-batches whose activations a stage holds at once under `ops`
// (a forward makes one live, its backward releases it).
int64_t MaxLiveMicroBatches(const std::vector<Op>& ops);

std::string ToString(const Op& op);  // "F3", "B0", "step"

}  // namespace gpipe

#endif  // GPIPE_SERVICES_PIPELINE_SCHEDULE_H_
