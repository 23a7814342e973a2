#include "services/pipeline/worker_step.h"

#include "absl/strings/str_cat.h"
#include "services/core/status.h"

namespace gpipe {

absl::StatusOr<std::vector<StageStepResult>> RunWorkerStep(
    const std::vector<Stage*>& chunks, const std::vector<Op>& ops,
    int64_t step) {
  const int64_t v = static_cast<int64_t>(chunks.size());
  std::vector<StageStepResult> results(chunks.size());
  for (Stage* chunk : chunks) RETURN_IF_ERROR(chunk->BeginStep(step));
  for (size_t i = 0; i < ops.size();) {
    const Op& op = ops[i];
    if (op.kind != OpKind::kOptimizerStep) {
      if (op.chunk < 0 || op.chunk >= v) {
        return absl::InvalidArgumentError(absl::StrCat(
            "an op of chunk ", op.chunk, " on a worker of ", v, " chunks"));
      }
      // Consecutive weight halves of one chunk run as a group.
      ASSIGN_OR_RETURN(const size_t ran,
                       chunks[op.chunk]->RunOps(std::span(ops).subspan(i)));
      i += ran;
      continue;
    }
    ++i;
    for (Stage* chunk : chunks) RETURN_IF_ERROR(chunk->SendGradSquares());
    for (int64_t c = v; c-- > 0;) {
      ASSIGN_OR_RETURN(results[c], chunks[c]->FinishStep());
    }
  }
  return results;
}

}  // namespace gpipe
