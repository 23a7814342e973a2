#include "worker/memory_budget.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/core/bytes.h"

namespace gpipe {

namespace {
// Frames in flight, gRPC's buffers and the heap's slack are not tensors and
// are not counted: keep 64 MiB and 1/32 of the limit for them.
constexpr int64_t kMinReserve = int64_t{64} << 20;
constexpr int64_t kReserveFraction = 32;
constexpr absl::string_view kMemoryErrorPrefix = "out of memory: ";
}  // namespace

absl::StatusOr<MemoryBudget> ComputeMemoryBudget(absl::string_view flag,
                                                 int64_t system_limit,
                                                 int64_t resident) {
  MemoryBudget b;
  if (flag.empty() || flag == "auto") {
    b.limit = system_limit;
    b.source = "the machine's memory or its cgroup's limit";
  } else {
    auto limit = ParseBytes(flag, "--memory_limit");
    if (!limit.ok()) return limit.status();
    if (*limit == 0) {
      return absl::InvalidArgumentError(
          "--memory_limit: must be more than 0 (empty: the system's limit)");
    }
    b.limit = *limit;
    b.source = "--memory_limit";
  }
  b.resident = resident;
  b.reserve = kMinReserve + b.limit / kReserveFraction;
  b.stages = b.limit - b.resident - b.reserve;
  if (b.stages <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--memory_limit: ", FormatBytes(b.limit), " (", b.source,
                     ") leaves nothing for stages: the worker itself uses ",
                     FormatBytes(b.resident), " and keeps ",
                     FormatBytes(b.reserve), " for buffers"));
  }
  return b;
}

absl::Status MemoryError(absl::string_view what) {
  return absl::ResourceExhaustedError(absl::StrCat(kMemoryErrorPrefix, what));
}

bool IsMemoryError(const absl::Status& s) {
  return absl::StartsWith(s.message(), kMemoryErrorPrefix);
}

}  // namespace gpipe
