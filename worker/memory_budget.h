// How much memory this worker's stages may hold: --memory_limit, or the
// machine's or its cgroup's limit, less what the worker itself uses and a
// reserve for what is not a tensor (gRPC buffers, frames, the heap's slack).
#ifndef GPIPE_WORKER_MEMORY_BUDGET_H_
#define GPIPE_WORKER_MEMORY_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gpipe {

struct MemoryBudget {
  int64_t limit = 0;     // the whole process may use
  std::string source;    // "--memory_limit", "cgroup or physical memory"
  int64_t resident = 0;  // the worker's own, when it was computed
  int64_t reserve = 0;   // kept for what is not a tensor
  int64_t stages = 0;    // what stages may hold: advertised and enforced
};

// `flag`: --memory_limit's text ("" or "auto": the system's limit).
// `system_limit` and `resident` are SystemMemoryLimit() and ResidentBytes()
// (parameters, so a test can pass its own). InvalidArgument for a flag that
// does not parse or a limit that leaves nothing for stages.
absl::StatusOr<MemoryBudget> ComputeMemoryBudget(absl::string_view flag,
                                                 int64_t system_limit,
                                                 int64_t resident);

// A stage (or a link's segment) that does not fit this worker's memory:
// the job's size, not the worker's fault, and no other worker of the same
// size would do better (the job fails as OutOfMemory, not retried).
absl::Status MemoryError(absl::string_view what);
bool IsMemoryError(const absl::Status& s);

}  // namespace gpipe

#endif  // GPIPE_WORKER_MEMORY_BUDGET_H_
